"""Hostile input: every field a tenant writes (the whole network config on stdin, CNI_ARGS)
and every CNI variable, bent every way that has hurt a CNI plugin — against docs/security.md.

Each case is one call of the `tenantnet` executable. It must answer exit code 1 with exactly
one CNI error document on stdout whose `code` is the documented one and whose `msg` names
the field; no traceback; at most two lines on stderr; within a bounded time (a FIFO or
/dev/zero must not hang or exhaust anything). And it must leave the node as it found it:

- no file created, changed, removed — or created and removed again, or a decoy opened —
  outside tenantnet's own directories (hostile_support.FsWatcher, stat snapshots plus
  inotify: /var/lib and /var/log through an overlay of the suite's own that every exec and
  the agent see them through, whose upper layers hold exactly what they wrote there; /etc,
  /root, /dev/shm … compared whole; /, /tmp, /run, the working directories and the nearest
  existing ancestor of every path the case names, by the names the case uses and the
  suite's token);
- no OVS port, pod link, attachment record (or `*.json.tmp.*`), host-local allocation,
  tenantnet-ipam row or simulated VF state changed, and no host link the call can own
  (its names, its container id's mark, our labs' NICs) (hostile_support.node_state);
  other runs' links, bridges and files on the machine are not counted
  (test_watchers_count_the_calls_doing_and_nothing_else shows both sides);
- no process left running (the in-process exec's process group; the agent's children), and
  an agent that is still alive, idle, and has served the request itself.

Two ways in, parametrised: `agent` (one agent for the module, started with
test_agent.start_agent on the lab's node config plus `agentSocket`; the request sent through
the shim) runs EVERY case; `inproc` (the executable with no agent: the shim runs the plugin in
its own process, ≈ 110 ms of interpreter and imports per exec) runs a representative subset
of about a third, chosen by `_inproc` below: every case of the groups where the in-process
path does something the agent does not (logFile/logLevel — it opens the NAD's log itself —,
CNI_NETNS, stdin, ipam.type, delegation, CHECK, GC), every case naming a FIFO, a device, a
symlink, a huge file or an escape (`..` out, NUL, a sibling directory), and the first case
of every other group. Both ways run the same code behind `cni.skel.run`, so the agent run
of a case stands for both where the subset leaves it out; running all ≈ 650 cases in-process
as well would add about a minute on a 2-core box, past the suite's time budget (< 90 s).
Cases that need a simulated SR-IOV NIC (VF fields, device-info files) run on `nic_lab`
through the same agent (the request's TENANTNET_CONFIG names that lab).

Safety: every exec runs in its own session with RLIMIT_AS 4 GiB (the agent gets the same
head-room by prlimit), a time-out, and FIFOs a case names are given a writer afterwards, so
that a plugin that blocks on a FIFO or reads /dev/zero fails the case instead of the
machine. Paths the plugin must not write are fresh names carrying a random token, or decoy
files the suite creates (and removes); what a failing case created is removed again.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration import hostile_support as hs
from tests.integration import nodestate
from tests.integration.conftest import BIN, GO_PLUGINS, PLUGIN, Lab, new_cid
from tests.integration.test_agent import AgentProcess, agent_node_config, start_agent
from tests.polling import poll

INPROC_TIMEOUT = 12.0
AGENT_TIMEOUT = 8  # TENANTNET_AGENT_TIMEOUT: the shim's bound on the agent's answer
MEM_LIMIT = 4 << 30
DELETE = object()  # a conf change that removes the key
WAYS = ("inproc", "agent")
CNI_ARGS = "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns1;K8S_POD_NAME=pod1"


# ---- the cases --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Case:
    id: str
    code: int
    text: tuple[str, ...]  # the msg must contain one of these
    conf: dict[str, Any] = field(default_factory=dict)  # dotted key -> value (DELETE removes)
    env: dict[str, str | None] = field(default_factory=dict)  # None unsets
    stdin: Callable[[dict[str, Any]], bytes] | None = None  # raw stdin from the (changed) conf
    command: str = "ADD"
    base: str = "ovs"  # ovs | own (tenantnet-ipam) | sriov | check | gc
    lab: str = "lab"  # lab | nic
    group: str = ""


CASES: list[Case] = []


def case(group: str, label: str, code: int, text: str | tuple[str, ...], **kw: Any) -> None:
    if kw.get("base") == "sriov":
        kw.setdefault("lab", "nic")
    CASES.append(Case(f"{group}-{label}", code, (text,) if isinstance(text, str) else text, group=group, **kw))


def each(group: str, key: str, code: int, text: str, values: dict[str, Any], **kw: Any) -> None:
    """One case per value of one config field (dotted key)."""
    extra = kw.pop("conf", {})
    for label, value in values.items():
        case(group, label, code, text, conf={**extra, key: value}, **kw)


def env_each(var: str, code: int, values: dict[str, str | None], text: str | None = None, **kw: Any) -> None:
    for label, value in values.items():
        case(var, label, code, text or var, env={var: value}, **kw)


def _with(extra: str) -> Callable[[dict[str, Any]], bytes]:
    """The conf as JSON with `extra` spliced in as the last member."""
    def build(conf: dict[str, Any]) -> bytes:
        return json.dumps(conf)[:-1].encode() + b", " + extra.encode() + b"}"
    return build


def _padded_to(size: int) -> Callable[[dict[str, Any]], bytes]:
    def build(conf: dict[str, Any]) -> bytes:
        data = json.dumps(conf).encode()
        return data + b" " * (size - len(data))
    return build


def _deep(levels: int, kind: str = "[") -> Callable[[dict[str, Any]], bytes]:
    """A valid conf with a member nested `levels` deep below the top-level object."""
    if kind == "[":
        inner = "[" * levels + "]" * levels
    else:
        inner = '{"a": ' * (levels - 1) + "{}" + "}" * (levels - 1)
    return _with('"x-deep": ' + inner)


def _raw(data: bytes) -> Callable[[dict[str, Any]], bytes]:
    return lambda conf: data


OUT_ETC = "/etc/tnhx-@TOK@"
OUT_ROOT = "/root/tnhx-@TOK@"
OUT_TMP = "/tmp/tnhx-@TOK@"

# -- CNI_COMMAND, CNI_CONTAINERID, CNI_IFNAME -------------------------------------------------------
env_each("CNI_COMMAND", 4, {
    "unset": None, "empty": "", "lowercase": "add", "mixed-case": "Add", "trailing-newline": "ADD\n",
    "leading-space": " ADD", "trailing-space": "ADD ", "two-verbs": "ADD;DEL", "traversal": "../ADD",
    "unknown": "FOO", "delete": "DELETE", "version-newline": "VERSION\n",
})
env_each("CNI_CONTAINERID", 4, {
    "unset": None, "empty": "", "traversal": "../../etc", "parent": "..", "dot": ".", "slash": "abc/def",
    "absolute": "/etc/passwd", "newline": "abc\ndef", "trailing-newline": "abc123\n", "carriage-return": "abc\r",
    "tab": "abc\tdef", "control": "abc\x01def", "overlong-201": "a" * 201, "leading-dash": "-abc",
    "leading-underscore": "_abc", "space": "abc def", "semicolon": "abc;rm", "unicode": "\u00e4bc123",
})
env_each("CNI_IFNAME", 4, {
    "unset": None, "empty": "", "16-ascii": "a" * 16, "e-acute-x8-16-bytes": "\u00e9" * 8,
    "euro-x6-18-bytes": "\u20ac" * 6, "14-ascii-plus-e-acute-16-bytes": "a" * 14 + "\u00e9",
    "emoji-16-bytes-7-chars": "net1" + "\U0001f600" * 3, "cjk-7-chars-21-bytes": "\u7f51\u7edc\u63a5\u53e3\u540d\u5b57\u554a",
    "u-umlaut-x15-30-bytes": "\u00fc" * 15, "dot": ".", "dotdot": "..", "traversal": "../x", "slash": "a/b",
    "colon": "net:1", "space": "net 1", "trailing-newline": "net1\n", "leading-tab": "\tnet1",
    "control": "net\x01", "del": "net\x7f", "nbsp": "net\u00a0", "line-separator": "net\u2028",
    "ideographic-space": "net\u30001",
})

# -- CNI_NETNS -----------------------------------------------------------------------------------------
env_each("CNI_NETNS", 4, {
    "unset": None, "empty": "", "relative": "run/netns/@NSNAME@", "proc-self-net": "/proc/self/ns/net",
    "proc-1-net": "/proc/1/ns/net", "thread-self-net": "/proc/thread-self/ns/net",
    "proc-self-mnt": "/proc/self/ns/mnt", "proc-self-uts": "/proc/self/ns/uts", "proc-self-user": "/proc/self/ns/user",
    "regular-file": "@SCRATCH@/regular", "etc-hostname": "/etc/hostname", "directory": "/run/netns",
    "directory-slash": "/run/netns/", "root": "/", "dev-null": "/dev/null", "dev-zero": "/dev/zero",
    "fifo": "@SCRATCH@/fifo", "symlink-to-host": "@SCRATCH@/hostns-link", "host-bind-mount": "@HOSTNS@",
    "dotdot": "/run/netns/../netns/@NSNAME@", "trailing-newline": "@NS@\n", "missing": "/run/netns/tnt-hx-missing-@TOK@",
    "stdin-pipe": "/proc/self/fd/0",
})

# -- CNI_ARGS -------------------------------------------------------------------------------------------
env_each("CNI_ARGS", 4, {
    "no-equals": "K8S_POD_NAME", "empty-key": "=x", "unknown-key": "FOO=bar",
    "ignoreunknown-0": "IgnoreUnknown=0;FOO=bar", "ignoreunknown-yes": "IgnoreUnknown=yes;FOO=bar",
})
env_each("CNI_ARGS", 4, {
    "mac-garbage": "IgnoreUnknown=1;MAC=zz", "mac-multicast": "MAC=01:00:5e:00:00:01",
    "mac-broadcast": "MAC=ff:ff:ff:ff:ff:ff", "mac-zero": "MAC=00:00:00:00:00:00",
    "mac-trailing-newline": "MAC=02:00:00:00:00:01\n", "mac-bad-hex": "MAC=02:00:00:00:00:0g",
    "mac-dashes": "MAC=02-00-00-00-00-01", "mac-7-octets": "MAC=02:00:00:00:00:01:02",
}, text="MAC")
env_each("CNI_ARGS", 4, {
    "ip-octet": "IP=10.77.0.999", "ip-prefix-33": "IP=10.77.0.5/33", "ip-traversal": "IP=../../etc",
    "ip-second-bad": "IP=10.77.0.5,bogus", "ip-float": "IP=1e100", "ip-v6-garbage": "IP=::ffff:zz",
}, text="IP")
env_each("CNI_ARGS", 4, {
    "pod-namespace-traversal": CNI_ARGS.replace("ns1", "../../etc"),
    "pod-namespace-newline": CNI_ARGS.replace("ns1", "ns\n1"),
    "pod-namespace-overlong": CNI_ARGS.replace("ns1", "n" * 300),
}, text="K8S_POD_NAMESPACE")
env_each("CNI_ARGS", 4, {
    "pod-name-slash": CNI_ARGS.replace("pod1", "a/b"),
    "pod-name-control": CNI_ARGS.replace("pod1", "pod\x1b[2J"),
}, text="K8S_POD_NAME")
env_each("CNI_ARGS", 4, {"pod-namespace-64-chars": CNI_ARGS.replace("ns1", "n" * 64),
                         "pod-namespace-colon": CNI_ARGS.replace("ns1", "ns:1")}, text="K8S_POD_NAMESPACE")
env_each("CNI_ARGS", 4, {"pod-name-254-chars": CNI_ARGS.replace("pod1", "p" * 254)}, text="K8S_POD_NAME")
env_each("CNI_ARGS", 4, {"pod-uid-traversal": CNI_ARGS + ";K8S_POD_UID=../../x",
                         "pod-uid-129-chars": CNI_ARGS + ";K8S_POD_UID=" + "u" * 129}, text="K8S_POD_UID")

# -- stdin: decoding, size, nesting ----------------------------------------------------------------
for label, data in {"empty": b"", "not-json": b"{not json", "array": b"[1, 2]", "null": b"null",
                    "string": b'"tenantnet"', "number": b"42", "bad-utf8": b'{"cniVersion": "1.0.0", "name": "\xff"}',
                    "two-documents": b'{"cniVersion": "1.0.0"}{"cniVersion": "1.0.0"}',
                    "trailing-garbage": b'{"cniVersion": "1.0.0"} x'}.items():
    case("stdin", label, 6, ("decode", "stdin", "JSON object"), stdin=_raw(data))
case("stdin", "int-5000-digits", 6, ("decode", "stdin"), stdin=_with('"mtu": ' + "9" * 5000))
for label, size in {"1MiB-plus-1": (1 << 20) + 1, "1.5MiB": 3 << 19, "3MiB": 3 << 20}.items():
    case("stdin", f"oversize-{label}", 6, ("stdin", "bytes", "MiB"), stdin=_padded_to(size))
case("stdin", "oversize-long-string", 6, ("stdin", "bytes", "MiB"), conf={"x-pad": "a" * ((1 << 20) + 10)})
for levels in (65, 100, 1000, 100000):
    case("stdin", f"nesting-arrays-{levels}", 6, ("nest", "deep", "levels"), stdin=_deep(levels))
for levels in (65, 500):
    case("stdin", f"nesting-objects-{levels}", 6, ("nest", "deep", "levels"), stdin=_deep(levels, "{"))
case("stdin", "nesting-in-args", 6, ("nest", "deep", "levels"),
     stdin=_with('"args": {"cni": {"x": ' + "[" * 80 + "]" * 80 + "}}"))

# -- cniVersion, name, type, mode ------------------------------------------------------------------------
each("cniVersion", "cniVersion", 1, "cniVersion", {
    "0.2.0": "0.2.0", "9.9.9": "9.9.9", "trailing-newline": "1.0.0\n", "leading-space": " 1.0.0",
    "two-parts": "1.0", "four-parts": "1.0.0.0", "v-prefix": "v1.0.0", "number": 1.0, "list": ["1.0.0"],
    "null": None, "empty": "",
})
each("name", "name", 7, "name", {
    "traversal": "../evil", "slash": "a/b", "trailing-newline": "evil\n", "empty": "", "dot": ".", "dotdot": "..",
    "leading-dash": "-x", "space": "a b", "overlong-201": "a" * 201, "number": 5, "null": None, "list": ["x"],
    "unicode": "n\u00e4t", "semicolon": "x;y",
})
each("type", "type", 7, "type", {"number": 5, "list": ["tenantnet"]})
each("mode", "mode", 7, "mode", {
    "bogus": "bogus", "uppercase": "OVS", "trailing-newline": "ovs\n", "leading-space": " ovs", "number": 1,
    "list": ["ovs"], "object": {},
})
case("mode", "sriov-without-vf", 7, ("deviceID", "pf"), conf={"mode": "sriov"})
case("mode", "offload-without-vf", 7, ("deviceID", "pf"), conf={"mode": "ovs-offload"})

# -- bridge, vlan, trunk, mtu, ofport_request, mac -------------------------------------------------------
each("bridge", "bridge", 7, "bridge", {
    "traversal": "br/../x", "parent": "../br", "trailing-newline": "@BRIDGE@\n", "leading-space": " @BRIDGE@",
    "number": 5, "list": ["@BRIDGE@"], "64-chars": "b" * 64, "space": "br lab", "semicolon": "br;x",
    "leading-dash": "-br", "unknown": "br-nowhere-@TOK@", "trailing-slash": "@BRIDGE@/", "dot": ".",
    "dotdot": "..", "unicode": "br\u00e4",
})
case("bridge", "empty-mode-ovs", 7, "bridge", conf={"mode": "ovs", "bridge": ""})
each("vlan", "vlan", 7, "vlan", {
    "4095": 4095, "negative": -1, "string": "100", "bool": True, "float": 1.5, "float-integral": 1000.0,
    "list": [100], "object": {"id": 1}, "65536": 65536, "nan": float("nan"), "infinity": float("inf"),
})
each("trunk", "trunk", 7, "trunk", {
    "number": 5, "string": "10", "object": {"id": 5}, "bare-ids": [5], "id-5000": [{"id": 5000}],
    "id-negative": [{"id": -1}], "id-string": [{"id": "5"}], "id-bool": [{"id": True}],
    "min-gt-max": [{"minID": 30, "maxID": 20}], "min-only": [{"minID": 1}], "unknown-key": [{"from": 1}],
    "range-4095": [{"minID": 0, "maxID": 4095}], "null-item": [None],
})
each("mtu", "mtu", 7, "mtu", {
    "10": 10, "67": 67, "65536": 65536, "negative": -1, "string": "1500", "bool": True, "float": 1500.5,
    "list": [1500], "nan": float("nan"), "infinity": float("inf"), "huge": 10 ** 20,
})
each("ofport_request", "ofport_request", 7, "ofport_request", {
    "0": 0, "negative": -1, "65280": 65280, "string": "1", "bool": True, "float": 1.5, "list": [1], "huge": 10 ** 12,
})
MACS = {
    "garbage": "xx", "multicast": "01:00:5e:00:00:01", "broadcast": "ff:ff:ff:ff:ff:ff", "zero": "00:00:00:00:00:00",
    "trailing-newline": "02:00:00:00:00:01\n", "5-octets": "02:00:00:00:00", "7-octets": "02:00:00:00:00:01:02",
    "bad-hex": "02:00:00:00:00:0G", "leading-space": " 02:00:00:00:00:01", "number": 5, "list": ["02:00:00:00:00:01"],
}
each("mac", "mac", 7, "mac", MACS)
each("runtimeConfig.mac", "runtimeConfig.mac", 7, "runtimeConfig.mac",
     {k: MACS[k] for k in ("garbage", "multicast", "zero", "trailing-newline", "7-octets", "number", "list")})

# -- ovs-cni compatibility fields -----------------------------------------------------------------------
each("interface_type", "interface_type", 2, "interface_type", {
    "dpdk": "dpdk", "internal": "internal", "patch": "patch", "vxlan": "vxlan", "dpdkvhostuser": "dpdkvhostuser",
    "system-newline": "system\n", "System": "System",
})
for key in ("link_state_check_retries", "link_state_check_interval"):
    each(key, key, 7, key, {"negative": -1, "string": "5", "bool": True, "float": 1.5, "list": [1]})
each("socket_file", "socket_file", 7, "socket_file", {
    "scheme-ftp": "ftp:host", "unix-empty": "unix:", "unix-relative": "unix:relative/db.sock",
    "relative": "relative.sock", "number": 5, "list": ["@OVSDB@"], "system-ovs": "unix:/run/openvswitch/db.sock",
    "system-ovs-bare": "/var/run/openvswitch/db.sock", "tcp-local": "tcp:127.0.0.1:6640", "tcp-port-0": "tcp:127.0.0.1:0",
    "tcp-v6": "tcp:[::1]:6640", "dotdot": "unix:@SOCKDIR@/../@SOCKDIRNAME@/db.sock",
    "double-slash": "unix:@SOCKDIR@//db.sock", "dot": "unix:@SOCKDIR@/./db.sock", "trailing-newline": "@OVSDB@\n",
    "nul": "@OVSDB@\u0000", "shadow": "unix:/etc/shadow", "punix": "punix:@SOCK@",
    "ovsdb-server-ctl": "unix:@SOCKDIR@/ovsdb-server.ctl", "vswitchd-ctl": "unix:@SOCKDIR@/ovs-vswitchd.ctl",
})
each("socket_file", "socket_file", 2, "socket_file", {"ssl-local": "ssl:127.0.0.1:6640", "ssl-remote": "ssl:10.0.0.1:6640"})

# -- configuration_path -------------------------------------------------------------------------------
each("configuration_path", "configuration_path", 7, "configuration_path", {
    "etc-shadow": "/etc/shadow", "etc-passwd": "/etc/passwd", "root-bashrc": "/root/.bashrc",
    "tmp-missing": OUT_TMP + ".json", "proc-self-environ": "/proc/self/environ", "proc-1-environ": "/proc/1/environ",
    "dev-zero": "/dev/zero", "dev-null": "/dev/null", "dev-urandom": "/dev/urandom", "dev-stdin": "/dev/stdin",
    "default-dir-not-allowed": "/etc/kubernetes/cni/net.d/ovs.d/tnhx-@TOK@.json", "relative": "ovs.json",
    "dotdot-escape": "@OVSD@/../../../../../../../../etc/shadow", "dotdot-inside": "@OVSD@/tnhx-dir/../ok.json",
    "double-slash": "@OVSD@//ok.json", "dot": "@OVSD@/./ok.json", "trailing-newline": "@OVSD@/ok.json\n",
    "nul": "@OVSD@/ok.json\u0000x", "number": 5, "list": ["@OVSD@/ok.json"], "object": {"a": 1},
    "prefix-sibling": "@OVSD@-evil/ok.json", "allowed-dir-itself": "@OVSD@", "directory": "@OVSD@/tnhx-dir",
    "symlink-to-shadow": "@OVSD@/tnhx-link", "symlink-to-valid-outside": "@OVSD@/tnhx-link-ok",
    "symlink-to-dev-zero": "@OVSD@/tnhx-zero", "fifo": "@OVSD@/tnhx-fifo", "huge-70KiB": "@OVSD@/tnhx-huge.json",
    "through-symlinked-dir": "@OVSD@/tnhx-dirlink/ok.json", "missing": "@OVSD@/tnhx-missing-@TOK@.json",
    "not-json": "@OVSD@/tnhx-notjson", "nested-30000-deep": "@OVSD@/tnhx-deep.json",
})
each("configuration_path", "configuration_path", 7, "socket_file", {
    "names-system-ovs": "@OVSD@/tnhx-badsock.json", "names-tcp": "@OVSD@/tnhx-tcpsock.json",
    "names-ovsdb-ctl": "@OVSD@/tnhx-ctlsock.json", "names-number": "@OVSD@/tnhx-intsock.json",
})
case("configuration_path", "names-ssl", 2, "socket_file", conf={"configuration_path": "@OVSD@/tnhx-sslsock.json"})

# -- logFile, logLevel -------------------------------------------------------------------------------------
each("logFile", "logFile", 7, "logFile", {
    "etc": OUT_ETC + ".log", "root": OUT_ROOT + ".log", "tmp": OUT_TMP + ".log", "var-log": "/var/log/tnhx-@TOK@.log",
    "dev-shm": "/dev/shm/tnhx-@TOK@.log", "var-lib": "/var/lib/tnhx-@TOK@.log", "run": "/run/tnhx-@TOK@.log",
    "fs-root": "/tnhx-@TOK@.log", "cron-d": "/etc/cron.d/tnhx-@TOK@", "existing-etc-file": "@DECOY_ETC@",
    "existing-root-file": "@DECOY_ROOT@", "dev-null": "/dev/null", "dev-stdout": "/dev/stdout",
    "dev-stderr": "/dev/stderr", "proc-self-fd-1": "/proc/self/fd/1", "relative": "tnhx-@TOK@.log",
    "relative-dot": "./tnhx-@TOK@.log", "dotdot": "@LOG@/../tnhx-@TOK@.log", "dotdot-2": "@LOG@/../../tnhx-@TOK@.log",
    "dotdot-escape": "@LOG@/../../../../../../../../etc/tnhx-@TOK@.log", "double-slash": "@LOG@//tnhx-@TOK@.log",
    "dot": "@LOG@/./tnhx-@TOK@.log", "subdir": "@LOG@/tnhx-@TOK@/x.log", "trailing-newline": "@LOG@/tnhx-@TOK@.log\n",
    "nul": "@LOG@/tnhx-@TOK@\u0000.log", "trailing-slash": "@LOG@/", "log-dir-itself": "@LOG@",
    "space-in-name": "@LOG@/tnhx @TOK@.log", "semicolon-in-name": "@LOG@/tnhx;@TOK@.log", "dotdot-name": "@LOG@/..",
    "prefix-sibling": "@LOG@-evil/tnhx-@TOK@.log", "symlink-to-decoy": "@LOG@/tnhx-link.log",
    "fifo": "@LOG@/tnhx-fifo.log", "directory": "@LOG@/tnhx-dir.log", "through-symlinked-dir": "@LOG@/tnhx-dirlink/x.log",
    "state-dir": "@STATE@/tnhx-@TOK@.log", "lab-root": "@ROOT@/tnhx-@TOK@.log", "number": 5, "bool": True,
    "list": ["@LOG@/x.log"], "object": {"a": 1},
})
case("logFile", "duplicate-key-last-wins", 7, "logFile", conf={"logFile": "@LOG@/tnhx-ok.log"},
     stdin=_with('"logFile": "' + OUT_ETC + '-dup.log"'))
each("logLevel", "logLevel", 7, "logLevel", {
    "trace": "trace", "verbose": "verbose", "critical": "critical", "trailing-newline": "debug\n",
    "leading-space": " debug", "empty": "", "number": 5, "list": ["debug"], "injection": "info;rm",
})

# -- runtimeConfig / args ----------------------------------------------------------------------------
each("runtimeConfig", "runtimeConfig", 7, "runtimeConfig", {"list": [1], "string": "x", "number": 5, "bool": True})
each("args", "args", 7, "args", {"string": "x", "list": [1]})
each("args.cni", "args.cni", 7, "args.cni", {"string": "x", "list": [1]})
IPS = {
    "string": "10.77.0.5/24", "number-item": [5], "null-item": [None], "octet": ["10.77.0.999/24"], "garbage": ["bogus"],
    "nested-list": [["10.77.0.5/24"]], "object": {"a": 1}, "trailing-newline": ["10.77.0.5/24\n"],
    "traversal": ["../../etc/x"],
}
each("runtimeConfig.ips", "runtimeConfig.ips", 7, "runtimeConfig.ips", IPS)
each("args.cni.ips", "args.cni.ips", 7, "args.cni.ips",
     {k: IPS[k] for k in ("string", "number-item", "octet", "garbage", "nested-list", "traversal")})
each("runtimeConfig.dns", "runtimeConfig.dns", 7, "runtimeConfig.dns", {
    "string": "8.8.8.8", "list": [1], "servers-string": {"servers": "8.8.8.8"}, "servers-number": {"servers": [1]},
    "servers-garbage": {"servers": ["not-an-ip"]}, "servers-object": {"servers": [{}]},
    "servers-newline": {"servers": ["8.8.8.8\n"]}, "searches-string": {"searches": "x"},
    "searches-number": {"searches": [1]}, "options-nested": {"options": [[1]]},
    "searches-two-words": {"searches": ["a.example b.example"]}, "options-newline": {"options": ["ndots:5\nnameserver 1.1.1.1"]},
})
each("dns", "dns", 7, "dns", {
    "nameservers-garbage": {"nameservers": ["not-an-ip"]}, "nameservers-string": {"nameservers": "8.8.8.8"},
    "nameservers-newline": {"nameservers": ["8.8.8.8\nsearch evil"]}, "search-two-words": {"search": ["a b"]},
    "options-control": {"options": ["ndots:5\x07"]},
})

# -- ipam ------------------------------------------------------------------------------------------------
each("ipam", "ipam", 7, "ipam", {"string": "host-local", "list": [1], "number": 5})
each("ipam.type", "ipam.type", 7, "ipam.type", {
    "tenantnet": "tenantnet", "tenantnet-newline": "tenantnet\n", "tenantnet-space": " tenantnet",
    "tenantnet-relative": "../tenantnet", "tenantnet-absolute": "@BIN@/tenantnet", "usr-bin-id": "/usr/bin/id",
    "bin-sh": "/bin/sh", "traversal-sh": "../../bin/sh", "dot": ".", "dotdot": "..", "number": 5,
    "list": ["host-local"], "trailing-slash": "host-local/", "missing": "no-such-ipam-@TOK@", "option": "-h",
    "space": "host local",
})
case("ipam.type", "symlink-to-tenantnet-on-cni-path", 7, "ipam.type", conf={"ipam.type": "tnhx-loop"},
     env={"CNI_PATH": "@EVIL_CNI_PATH@"})
case("ipam.type", "wrapper-execs-tenantnet", 7, ("ipam", "IPAM", "deleg"), conf={"ipam.type": "tnhx-wrap"},
     env={"CNI_PATH": "@EVIL_CNI_PATH@"})
case("delegation", "called-as-a-delegate", 7, ("deleg", "TENANTNET_DELEGATION_DEPTH"),
     env={"TENANTNET_DELEGATION_DEPTH": "1"})

DATADIRS = {
    "etc-new": OUT_ETC, "root-new": OUT_ROOT, "tmp-new": OUT_TMP, "etc": "/etc", "fs-root": "/", "dev-shm": "/dev/shm",
    "default-cni-networks": "/var/lib/cni/networks", "default-tenantnet-ipam": "/var/lib/tenantnet/ipam",
    "outside-existing-dir": "@DDIR@", "relative": "tnhx-@TOK@", "dotdot": "@DATA@/../tnhx-@TOK@",
    "dotdot-escape": "@DATA@/../../../../../../../../etc/tnhx-@TOK@", "double-slash": "@DATA@//tnhx-@TOK@",
    "dot": "@DATA@/./tnhx-@TOK@", "trailing-newline": "@DATA@\n", "nul": "@DATA@\u0000/tnhx-@TOK@",
    "prefix-sibling": "@DATA@-evil-@TOK@", "symlinked-dir": "@DATA@/tnhx-dirlink",
    "through-symlinked-dir": "@DATA@/tnhx-dirlink/sub-@TOK@", "state-dir": "@STATE@", "log-dir": "@LOG@",
    "number": 5, "list": ["@DATA@"],
}
each("ipam.dataDir", "ipam.dataDir", 7, "ipam.dataDir",
     {k: v.replace("@DATA@", "@HOSTLOCAL@") if isinstance(v, str) else v for k, v in DATADIRS.items()})
# Omitted, the plugin's default must be allowed: host-local's /var/lib/cni/networks is not on the
# lab node (its lists replace the defaults); tenantnet-ipam's is the node's ipamDataDir, inside them.
case("ipam.dataDir", "omitted-default-not-allowed", 7, "dataDir", conf={"ipam.dataDir": DELETE})
each("ipam.dataDir-own", "ipam.dataDir", 7, "ipam.dataDir",
     {k: DATADIRS[k].replace("@DATA@", "@IPAM@") for k in (
         "etc-new", "root-new", "tmp-new", "etc", "default-cni-networks", "outside-existing-dir", "relative",
         "dotdot", "double-slash", "nul", "prefix-sibling", "symlinked-dir", "state-dir")}, base="own")
RESOLV = {
    "etc-shadow": "/etc/shadow", "etc-resolv-conf-not-allowed": "/etc/resolv.conf", "root-bashrc": "/root/.bashrc",
    "proc-self-environ": "/proc/self/environ", "proc-1-environ": "/proc/1/environ", "dev-zero": "/dev/zero",
    "dev-null": "/dev/null", "dev-stdin": "/dev/stdin", "proc-self-fd-0": "/proc/self/fd/0", "relative": "resolv.conf",
    "dotdot-escape": "@RESOLV@/../../../../../../../../etc/shadow", "double-slash": "@RESOLV@//ok.conf",
    "dot": "@RESOLV@/./ok.conf", "trailing-newline": "@RESOLV@/ok.conf\n", "nul": "@RESOLV@/ok.conf\u0000",
    "allowed-dir-itself": "@RESOLV@", "directory": "@RESOLV@/tnhx-dir", "symlink-to-shadow": "@RESOLV@/tnhx-link",
    "symlink-to-valid-outside": "@RESOLV@/tnhx-link-ok", "symlink-to-dev-zero": "@RESOLV@/tnhx-zero",
    "fifo": "@RESOLV@/tnhx-fifo", "huge-70KiB": "@RESOLV@/tnhx-huge", "through-symlinked-dir": "@RESOLV@/tnhx-dirlink/ok.conf",
    "prefix-sibling": "@RESOLV@-evil/ok.conf", "missing": "@RESOLV@/tnhx-missing-@TOK@", "number": 5, "list": ["x"],
}
each("ipam.resolvConf", "ipam.resolvConf", 7, "ipam.resolvConf", RESOLV)
each("ipam.resolvConf-own", "ipam.resolvConf", 7, "ipam.resolvConf",
     {k: RESOLV[k] for k in ("etc-shadow", "etc-resolv-conf-not-allowed", "dev-zero", "fifo", "symlink-to-shadow",
                             "symlink-to-valid-outside", "huge-70KiB", "dotdot-escape", "prefix-sibling",
                             "through-symlinked-dir")}, base="own")

# -- prevResult (ADD chaining and CHECK) ---------------------------------------------------------------
PREV = {
    "string": "x", "list": [1], "interfaces-string": {"interfaces": "x"}, "interface-number": {"interfaces": [5]},
    "interface-no-name": {"interfaces": [{}]}, "interface-name-number": {"interfaces": [{"name": 5}]},
    "interface-mac-number": {"interfaces": [{"name": "eth0", "mac": 5}]},
    "interface-mac-garbage": {"interfaces": [{"name": "eth0", "mac": "zz"}]},
    "interface-mtu-string": {"interfaces": [{"name": "eth0", "mtu": "1500"}]},
    "interface-mtu-bool": {"interfaces": [{"name": "eth0", "mtu": True}]},
    "interface-sandbox-number": {"interfaces": [{"name": "eth0", "sandbox": 5}]},
    "ips-string": {"ips": "x"}, "ip-address-garbage": {"ips": [{"address": "x"}]},
    "ip-address-number": {"ips": [{"address": 5}]}, "ip-address-missing": {"ips": [{}]},
    "ip-gateway-garbage": {"ips": [{"address": "10.0.0.1/24", "gateway": "x"}]},
    "ip-gateway-number": {"ips": [{"address": "10.0.0.1/24", "gateway": 5}]},
    "ip-interface-string": {"ips": [{"address": "10.0.0.1/24", "interface": "0"}]},
    "ip-interface-negative": {"ips": [{"address": "10.0.0.1/24", "interface": -1}]},
    "routes-string": {"routes": "x"}, "route-dst-garbage": {"routes": [{"dst": "x"}]},
    "route-dst-number": {"routes": [{"dst": 5}]}, "route-gw-garbage": {"routes": [{"dst": "0.0.0.0/0", "gw": "x"}]},
    "route-mtu-string": {"routes": [{"dst": "0.0.0.0/0", "mtu": "1500"}]},
    "dns-string": {"dns": "x"}, "dns-nameservers-string": {"dns": {"nameservers": "x"}},
    "dns-nameservers-number": {"dns": {"nameservers": [1]}}, "dns-domain-number": {"dns": {"domain": 5}},
}
each("prevResult", "prevResult", 6, "prevResult", PREV)
each("prevResult-check", "prevResult", 6, "prevResult",
     {k: PREV[k] for k in ("string", "interface-name-number", "interface-mtu-string", "ip-address-garbage",
                           "ip-interface-string", "route-gw-garbage", "dns-nameservers-number")},
     base="check", command="CHECK")

# -- CHECK and GC read the same hostile fields ----------------------------------------------------------
for label, key, value, text in (
        ("logFile-etc", "logFile", OUT_ETC + ".log", "logFile"),
        ("configuration_path-dev-zero", "configuration_path", "/dev/zero", "configuration_path"),
        ("configuration_path-fifo", "configuration_path", "@OVSD@/tnhx-fifo", "configuration_path"),
        ("socket_file-system-ovs", "socket_file", "unix:/run/openvswitch/db.sock", "socket_file"),
        ("ipam.dataDir-etc", "ipam.dataDir", OUT_ETC, "ipam.dataDir"),
        ("ipam.resolvConf-shadow", "ipam.resolvConf", "/etc/shadow", "ipam.resolvConf"),
        ("ipam.type-tenantnet", "ipam.type", "tenantnet", "ipam.type")):
    case("CHECK", label, 7, text, conf={key: value}, base="check", command="CHECK")
for label, key, value, text in (
        ("configuration_path-dev-zero", "configuration_path", "/dev/zero", "configuration_path"),
        ("configuration_path-fifo", "configuration_path", "@OVSD@/tnhx-fifo", "configuration_path"),
        ("configuration_path-symlink", "configuration_path", "@OVSD@/tnhx-link-ok", "configuration_path"),
        ("socket_file-system-ovs", "socket_file", "unix:/run/openvswitch/db.sock", "socket_file"),
        ("socket_file-tcp", "socket_file", "tcp:127.0.0.1:6640", "socket_file")):
    case("GC", label, 7, text, conf={key: value}, base="gc", command="GC")

# -- SR-IOV fields, on the lab's simulated NIC (mode sriov, VF @VF0@) ---------------------------------
NO_DEV = {"deviceID": DELETE}
BAD_VF = {
    "garbage": "zz:00.1", "absent-vf": "0000:3b:01.7", "the-pf": "@PFADDR@", "trailing-newline": "@VF0@\n",
    "traversal": "../../../../etc", "vf-dotdot": "@VF0@/../0000:3b:00.3", "number": 5, "list": ["@VF0@"],
    "host-bridge": "0000:00:00.0", "leading-space": " @VF0@", "nul": "@VF0@\u0000",
}
each("deviceID", "deviceID", 7, "deviceID", BAD_VF, base="sriov")
each("pciBusID", "pciBusID", 7, "pciBusID",
     {k: BAD_VF[k] for k in ("garbage", "absent-vf", "the-pf", "trailing-newline", "traversal", "number")},
     base="sriov", conf=NO_DEV)
each("runtimeConfig.deviceID", "runtimeConfig.deviceID", 7, "runtimeConfig.deviceID",
     {k: BAD_VF[k] for k in ("garbage", "absent-vf", "the-pf", "trailing-newline", "traversal", "number")},
     base="sriov", conf=NO_DEV)
each("pf", "pf", 7, "pf", {
    "traversal": "lpf0/../x", "unknown": "nope0", "loopback": "lo", "host-nic": "eth0", "trailing-newline": "lpf0\n",
    "number": 5, "empty": "", "list": ["lpf0"], "escape": "../../etc", "a-vf-address": "@VF0@",
}, base="sriov", conf=NO_DEV)
each("pfs", "pfs", 7, "pfs", {
    "string": "lpf0", "number-item": [5], "unknown": ["nope0"], "trailing-newline": ["lpf0\n"], "empty-item": [""],
    "nested": [["lpf0"]], "object": {"lpf0": 1}, "traversal": ["../../etc"],
}, base="sriov", conf=NO_DEV)
each("sriov-vlan", "vlan", 7, "vlan", {"4095": 4095, "string": "100", "negative": -1, "bool": True}, base="sriov")
each("vlanQoS", "vlanQoS", 7, "vlanQoS", {"8": 8, "negative": -1, "string": "1", "bool": True, "float": 1.5},
     base="sriov")
case("vlanQoS", "without-vlan", 7, "vlanQoS", conf={"vlan": 0, "vlanQoS": 3}, base="sriov")
each("vlanProto", "vlanProto", 7, "vlanProto",
     {"802.1x": "802.1x", "number": 5, "trailing-newline": "802.1Q\n", "empty": "", "list": ["802.1ad"]}, base="sriov")
case("vlanProto", "qinq-without-vlan", 7, "vlanProto", conf={"vlan": 0, "vlanProto": "802.1ad"}, base="sriov")
each("spoofchk", "spoofchk", 7, "spoofchk",
     {"yes": "yes", "bool": True, "number": 1, "trailing-newline": "on\n", "empty": "", "list": ["on"]}, base="sriov")
each("trust", "trust", 7, "trust", {"yes": "yes", "bool": True, "number": 0, "trailing-newline": "off\n"},
     base="sriov")
each("link_state", "link_state", 7, "link_state",
     {"up": "up", "enabled": "enabled", "number": 1, "trailing-newline": "auto\n", "bool": True}, base="sriov")
for key in ("min_tx_rate", "max_tx_rate"):
    each(key, key, 7, key, {"negative": -1, "string": "100", "float": 1.5, "bool": True, "huge": 10 ** 12},
         base="sriov")
case("min_tx_rate", "above-max", 7, "min_tx_rate", conf={"min_tx_rate": 200, "max_tx_rate": 100}, base="sriov")
each("sriov-mac", "mac", 7, "mac", {"multicast": "01:00:5e:00:00:01", "trailing-newline": "02:00:00:00:00:01\n"},
     base="sriov")
each("sriov-mtu", "mtu", 7, "mtu", {"67": 67, "string": "1500"}, base="sriov")
each("CNIDeviceInfoFile", "runtimeConfig.CNIDeviceInfoFile", 7, "runtimeConfig.CNIDeviceInfoFile", {
    "etc": OUT_ETC + ".json", "root": OUT_ROOT + ".json", "tmp": OUT_TMP + ".json",
    "default-dir-not-allowed": "/var/run/k8s.cni.cncf.io/devinfo/tnhx-@TOK@.json", "existing-root-file": "@DECOY_ROOT@",
    "relative": "tnhx-@TOK@.json", "dotdot": "@DEVINFO@/../tnhx-@TOK@.json",
    "dotdot-escape": "@DEVINFO@/../../../../../../../../etc/tnhx-@TOK@.json", "double-slash": "@DEVINFO@//tnhx-@TOK@.json",
    "dot": "@DEVINFO@/./tnhx-@TOK@.json", "trailing-newline": "@DEVINFO@/tnhx-@TOK@.json\n",
    "nul": "@DEVINFO@/tnhx-@TOK@\u0000.json", "dir-itself": "@DEVINFO@", "trailing-slash": "@DEVINFO@/",
    "symlink-to-decoy": "@DEVINFO@/tnhx-link.json", "fifo": "@DEVINFO@/tnhx-fifo.json",
    "directory": "@DEVINFO@/tnhx-dir.json", "through-symlinked-dir": "@DEVINFO@/tnhx-dirlink/x-@TOK@.json",
    "existing-huge-70KiB": "@DEVINFO@/tnhx-huge.json", "prefix-sibling": "@DEVINFO@-evil/tnhx-@TOK@.json",
    "number": 5, "list": ["x"], "dev-null": "/dev/null", "proc-self-fd-1": "/proc/self/fd/1",
}, base="sriov")


# The in-process subset: every case of the groups where the in-process path does something the
# agent does not (open the NAD's log itself, read CNI_NETNS and stdin in a fresh process, exec an
# IPAM plugin that could recurse into tenantnet, CHECK and GC); every case that names a FIFO, a
# device, a symlink, a huge file or an escape through `..`, NUL or a sibling directory; and the
# first case of every other group.
INPROC_GROUPS = {"CNI_NETNS", "stdin", "logFile", "logLevel", "ipam.type", "delegation", "CHECK", "GC"}
INPROC_WORDS = ("fifo", "symlink", "dev-zero", "huge", "dirlink", "through-symlinked", "dotdot-escape",
                "prefix-sibling", "nul")


def _inproc(c: Case) -> bool:
    label = c.id[len(c.group) + 1:]
    first = next(x.id for x in CASES if x.group == c.group)
    return c.group in INPROC_GROUPS or any(w in label for w in INPROC_WORDS) or c.id == first


RUNS = [pytest.param(c, way, id=f"{c.id}-{way}") for c in CASES for way in WAYS
        if way == "agent" or _inproc(c)]


def test_case_table_is_big_and_unique():
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids)), sorted({i for i in ids if ids.count(i) > 1})
    assert len(CASES) >= 300
    assert sum(1 for r in RUNS if r.values[1] == "inproc") >= 100


# ---- the module's node: labs, decoys, fixture files, a pod netns, an agent ---------------------------

@dataclass
class LabCtx:
    """One lab as the cases see it: its node configs (in-process, agent) and placeholders."""

    lab: Lab
    nic: bool
    node_inproc: Path
    node_agent: Path
    values: dict[str, str]
    own_ipam: Path
    made: list[Path] = field(default_factory=list)  # fixture entries to remove at the end

    def state(self, netns: str) -> hs.NodeState:
        return hs.node_state(self.lab, netns, self.own_ipam, nic=self.nic)


def _node_dirs(lab: Lab) -> dict[str, str]:
    """The node config's directories, as docs/security.md and the lab write them."""
    data = yaml.safe_load(lab.node_config.read_text()) or {}
    root = str(lab.root)
    datadirs = list(data.get("ipamDataDirs") or [f"{root}/ipam", f"{root}/host-local"])
    return {
        "LOG": os.path.dirname(data.get("logFile") or f"{root}/log/tenantnet.log"),
        "DEVINFO": data.get("deviceInfoDir") or f"{root}/devinfo",
        "IPAM": datadirs[0],
        "HOSTLOCAL": str(lab.hostlocal_dir),
        "RESOLV": (data.get("resolvConfPaths") or [f"{root}/resolv.d"])[0],
        "OVSD": (data.get("ovsConfigurationPaths") or [f"{root}/ovs.d"])[0],
    }


def _intact(p: Path, kind: str, content: bytes | str) -> bool:
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        return False
    if kind == "dir":
        return stat.S_ISDIR(st.st_mode)
    if kind == "fifo":
        return stat.S_ISFIFO(st.st_mode)
    if kind == "link":
        return stat.S_ISLNK(st.st_mode) and os.readlink(p) == str(content)
    data = content if isinstance(content, bytes) else content.encode()
    return stat.S_ISREG(st.st_mode) and st.st_size == len(data)


def _make(ctx: LabCtx, path: str, kind: str, content: bytes | str = b"") -> None:
    """A fixture entry; one that a failing case removed or replaced is made again."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    if _intact(p, kind, content):
        return
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p)
    elif os.path.lexists(p):
        p.unlink()
    if kind == "dir":
        p.mkdir(mode=0o700)
    elif kind == "fifo":
        os.mkfifo(p, 0o600)
    elif kind == "link":
        os.symlink(str(content), p)
    else:
        p.write_bytes(content if isinstance(content, bytes) else content.encode())
    if p not in ctx.made:
        ctx.made.append(p)


def _populate(ctx: LabCtx) -> None:
    v = ctx.values
    for key in ("LOG", "DEVINFO", "IPAM", "HOSTLOCAL", "RESOLV", "OVSD"):
        Path(v[key]).mkdir(parents=True, exist_ok=True, mode=0o700)
    ok_json = json.dumps({"socket_file": v["OVSDB"]})
    for d in ("LOG", "DEVINFO", "RESOLV", "OVSD"):
        _make(ctx, v[d] + "-evil", "dir")
    _make(ctx, v["OVSD"] + "-evil/ok.json", "file", ok_json)
    _make(ctx, v["RESOLV"] + "-evil/ok.conf", "file", "nameserver 10.9.9.9\n")
    for d, suffix, target in (("LOG", ".log", v["DECOY_ROOT"]), ("DEVINFO", ".json", v["DECOY_ROOT"]),
                              ("RESOLV", "", "/etc/shadow"), ("OVSD", "", "/etc/shadow")):
        _make(ctx, f"{v[d]}/tnhx-link{suffix}", "link", target)
        _make(ctx, f"{v[d]}/tnhx-fifo{suffix}", "fifo")
        _make(ctx, f"{v[d]}/tnhx-dir{suffix}", "dir")
    for d, target in (("LOG", v["DDIR"]), ("DEVINFO", v["DDIR"]), ("IPAM", v["DDIR"]), ("HOSTLOCAL", v["DDIR"]),
                      ("RESOLV", v["RESOLV"] + "-evil"), ("OVSD", v["OVSD"] + "-evil")):
        _make(ctx, f"{v[d]}/tnhx-dirlink", "link", target)
    for d, name in (("RESOLV", "ok.conf"), ("OVSD", "ok.json")):
        _make(ctx, f"{v[d]}/tnhx-link-ok", "link", f"{v[d]}-evil/{name}")
        _make(ctx, f"{v[d]}/tnhx-zero", "link", "/dev/zero")
    _make(ctx, v["RESOLV"] + "/tnhx-huge", "file", "nameserver 10.9.9.9\n" * 4000)  # 80 kB
    _make(ctx, v["OVSD"] + "/tnhx-huge.json", "file", json.dumps({"socket_file": v["OVSDB"], "pad": "x" * 70000}))
    _make(ctx, v["DEVINFO"] + "/tnhx-huge.json", "file",
          json.dumps({"type": "pci", "version": "1.1.0", "pci": {}, "pad": "x" * 70000}))
    # Valid files inside the allowed directories: a path trick that is normalised and accepted
    # instead of refused (`//`, `/./`, a trailing newline stripped) then *works*, and shows.
    _make(ctx, v["OVSD"] + "/ok.json", "file", ok_json)
    _make(ctx, v["RESOLV"] + "/ok.conf", "file", "nameserver 10.9.9.8\n")
    _make(ctx, v["OVSD"] + "/tnhx-notjson", "file", "socket_file = unix:/run/openvswitch/db.sock\n")
    _make(ctx, v["OVSD"] + "/tnhx-deep.json", "file", "[" * 30000 + "]" * 30000)
    for name, sock in (("badsock", "unix:/run/openvswitch/db.sock"), ("tcpsock", "tcp:127.0.0.1:6640"),
                       ("ctlsock", f"unix:{v['SOCKDIR']}/ovsdb-server.ctl"), ("sslsock", "ssl:127.0.0.1:6640"),
                       ("intsock", 5)):
        _make(ctx, f"{v['OVSD']}/tnhx-{name}.json", "file", json.dumps({"socket_file": sock}))


class AgentHolder:
    """The module's agent: one process, stopped by its pid; restarted if a case kills it."""

    def __init__(self, node: Path, view: hs.PrivateWrites) -> None:
        self.node = node
        self.view = view
        self.agent: AgentProcess | None = None

    def start(self) -> None:
        argv = [sys.executable, "-m", "tenantnet.entry.agentctl", "--node-config", str(self.node), "run"]
        self.agent = start_agent(self.node, command=self.view.wrap(argv))
        with open(f"/proc/{self.agent.proc.pid}/status") as fh:
            vm = next(int(line.split()[1]) for line in fh if line.startswith("VmSize:"))
        limit = vm * 1024 + MEM_LIMIT
        resource.prlimit(self.agent.proc.pid, resource.RLIMIT_AS, (limit, limit))

    @property
    def pid(self) -> int:
        assert self.agent is not None
        return self.agent.proc.pid

    def alive(self) -> bool:
        return self.agent is not None and self.agent.proc.poll() is None

    def served(self) -> int:
        assert self.agent is not None
        return self.agent.served()

    def settle(self) -> list[str]:
        """After a call: no child left, nothing in flight, still alive (else restarted)."""
        problems = []
        if not self.alive():
            problems.append(f"the agent died (exit {self.agent.proc.returncode if self.agent else '?'})")
            self.start()
            return problems
        # A child (an IPAM exec) may still be finishing after a late answer: give it a moment.
        poll(lambda: not hs.descendants(self.pid), 1.5)
        stray = hs.descendants(self.pid)
        if stray:
            problems.append(f"the agent had child processes left after answering: {stray}")
            hs.kill_pids(stray)

        def idle() -> bool:
            try:
                return self.agent is not None and self.agent.status()["inflight"] <= 0
            except Exception:
                return False

        if not poll(idle, 5):
            problems.append("the agent still had a request in flight 5 s after the answer (a wedged worker)")
            self.stop()
            self.start()
        return problems

    def stop(self) -> None:
        if self.agent is not None:
            hs.kill_pids(hs.descendants(self.agent.proc.pid))
            self.agent.stop()
            self.agent = None


@dataclass
class Hostile:
    token: str
    net: str
    scratch: Path
    netns: str
    values: dict[str, str]
    fs: hs.FsWatcher
    agent: AgentHolder
    view: hs.PrivateWrites  # how every exec of the plugin sees /var/lib and /var/log
    run_dir: Path
    labs: dict[str, LabCtx] = field(default_factory=dict)
    cached: dict[str, hs.NodeState] = field(default_factory=dict)
    # The shared whole-node snapshot (tests/integration/nodestate.py), kept across clean cases.
    node_cached: dict[str, Any] = field(default_factory=dict)
    # One thread beside the test's: the two looks at the node (below) run side by side.
    pool: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="hx-look"))

    def ctx(self, which: str, lab: Lab) -> LabCtx:
        if which not in self.labs:
            self.labs[which] = make_ctx(self, lab, which)
        return self.labs[which]

    def looks(self, ctx: LabCtx, state: bool = True, whole: bool = True) -> tuple[Any, Any]:
        """The lab's node state (hostile_support.node_state) and its whole-node snapshot
        (nodestate.snapshot), each only if asked for (else None). Both only read (OVSDB, `ip`,
        /proc, the lab's files) and neither depends on the other, so they are taken at once:
        the snapshot in the pool's thread while this one takes the node state."""
        pending = self.pool.submit(nodestate.snapshot, ctx.lab) if whole else None
        try:
            now = ctx.state(self.netns) if state else None
        finally:
            snap = pending.result() if pending is not None else None
        return now, snap


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEM_LIMIT, MEM_LIMIT))
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 30, 1 << 30))


def make_ctx(h: Hostile, lab: Lab, which: str) -> LabCtx:
    sock = lab.ovsdb.partition(":")[2]
    values = {**h.values, **_node_dirs(lab), "ROOT": str(lab.root), "STATE": str(lab.state_dir),
              "OVSDB": lab.ovsdb, "SOCK": sock, "SOCKDIR": os.path.dirname(sock),
              "SOCKDIRNAME": os.path.basename(os.path.dirname(sock)), "BRIDGE": lab.bridge}
    nic = which == "nic"
    if nic:
        from tenantnet.lab.nic import LabNic

        (pf,) = LabNic(str(lab.root)).describe()
        values.update(VF0=pf["vfs"][0]["address"], PFADDR=pf["pfAddress"])
        node_agent = h.run_dir / "nic-node.yaml"
        node_agent.write_text(lab.node_config.read_text() + f"agentSocket: {h.run_dir}/sock/agent.sock\n")
    else:
        node_agent = h.run_dir / "node.yaml"  # agent_node_config wrote it for the agent
    ctx = LabCtx(lab=lab, nic=nic, node_inproc=lab.node_config, node_agent=node_agent, values=values,
                 own_ipam=Path(values["IPAM"]))
    _populate(ctx)
    return ctx


@pytest.fixture(scope="module")
def hx(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hostile]:
    token = uuid.uuid4().hex[:10]
    scratch = tmp_path_factory.mktemp("hostile")
    run_dir = Path(tempfile.mkdtemp(prefix="tna-"))  # a unix socket path must stay under 108 bytes
    netns = f"tnt-hx-{token}"
    hostns = f"tnt-hxhost-{token}"
    made: list[str] = []
    views = [hs.PrivateWrites(scratch / "private-inproc"), hs.PrivateWrites(scratch / "private-agent")]
    holder = AgentHolder(agent_node_config(lab, run_dir), views[1])
    h: Hostile | None = None
    try:
        decoys = {"DECOY_ETC": f"/etc/tnhx-{token}-decoy", "DECOY_ROOT": f"/root/tnhx-{token}-decoy",
                  "DDIR": f"/root/tnhx-{token}-ddir"}
        for key in ("DECOY_ETC", "DECOY_ROOT"):
            Path(decoys[key]).write_text("decoy: tenantnet must never write here\n")
            made.append(decoys[key])
        os.mkdir(decoys["DDIR"], 0o700)
        made.append(decoys["DDIR"])
        (scratch / "cwd").mkdir()
        (scratch / "bin").mkdir()
        (scratch / "dir").mkdir()
        (scratch / "regular").write_text("not a namespace\n")
        os.mkfifo(scratch / "fifo", 0o600)
        os.symlink("/proc/1/ns/net", scratch / "hostns-link")
        os.symlink(PLUGIN, scratch / "bin" / "tnhx-loop")
        wrap = scratch / "bin" / "tnhx-wrap"
        wrap.write_text(f"#!/bin/sh\nexec {PLUGIN} \"$@\"\n")
        wrap.chmod(0o755)
        subprocess.run(["ip", "netns", "add", netns], check=True, capture_output=True)
        made.append("netns:" + netns)
        subprocess.run(["ip", "netns", "attach", hostns, str(os.getpid())], check=True, capture_output=True)
        made.append("netns:" + hostns)
        values = {**decoys, "TOK": token, "NET": f"tnhx{token}", "NS": f"/run/netns/{netns}", "NSNAME": netns,
                  "HOSTNS": f"/run/netns/{hostns}", "SCRATCH": str(scratch), "BIN": str(BIN),
                  "EVIL_CNI_PATH": f"{scratch / 'bin'}:{BIN}:{GO_PLUGINS}"}
        holder.start()
        fs = hs.FsWatcher(token, extra_full=[str(scratch / "cwd"), decoys["DDIR"]], extra_busy=[os.getcwd()],
                          exclude=[str(tmp_path_factory.getbasetemp()), str(run_dir)], private=views)
        h = Hostile(token=token, net=f"tnhx{token}", scratch=scratch, netns=netns, values=values, fs=fs,
                    agent=holder, view=views[0], run_dir=run_dir)
        h.ctx("lab", lab)
        yield h
    finally:
        holder.stop()
        if h is not None:
            h.fs.close()
            h.pool.shutdown()
        for ctx in (h.labs.values() if h else []):
            for p in reversed(ctx.made):
                if p.is_dir() and not p.is_symlink():
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    p.unlink(missing_ok=True)
        for item in reversed(made):
            if item.startswith("netns:"):
                subprocess.run(["ip", "netns", "delete", item[6:]], capture_output=True, check=False)
            elif os.path.isdir(item):
                shutil.rmtree(item, ignore_errors=True)
            else:
                Path(item).unlink(missing_ok=True)
        shutil.rmtree(run_dir, ignore_errors=True)


# ---- one call ----------------------------------------------------------------------------------------

def fill(value: Any, values: dict[str, str]) -> Any:
    if isinstance(value, str):
        if "@" in value:
            for key, sub in values.items():
                value = value.replace(f"@{key}@", sub)
        return value
    if isinstance(value, dict):
        return {k: fill(v, values) for k, v in value.items()}
    if isinstance(value, list):
        return [fill(v, values) for v in value]
    return value


def base_conf(c: Case, ctx: LabCtx, h: Hostile) -> dict[str, Any]:
    v = ctx.values
    if c.base == "sriov":
        return {"cniVersion": "1.0.0", "name": h.net, "type": "tenantnet", "deviceID": v["VF0"], "vlan": 100}
    conf: dict[str, Any] = {"cniVersion": "1.0.0", "name": h.net, "type": "tenantnet", "bridge": ctx.lab.bridge,
                            "vlan": 100}
    if c.base == "gc":
        return {**conf, "cniVersion": "1.1.0"}
    if c.base == "own":
        conf["ipam"] = {"type": "tenantnet-ipam", "ranges": [[{"subnet": "10.78.0.0/24"}]], "dataDir": v["IPAM"]}
    else:
        conf["ipam"] = {"type": "host-local", "ranges": [[{"subnet": "10.77.0.0/24"}]], "dataDir": v["HOSTLOCAL"]}
    if c.base == "check":
        conf["prevResult"] = {"cniVersion": "1.0.0", "interfaces": [{"name": "net1", "sandbox": v["NS"]}]}
    return conf


def apply(conf: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    conf = json.loads(json.dumps(conf))
    for dotted, value in changes.items():
        *parents, last = dotted.split(".")
        target = conf
        for key in parents:
            if not isinstance(target.get(key), dict):
                target[key] = {}
            target = target[key]
        if value is DELETE:
            target.pop(last, None)
        else:
            target[last] = value
    return conf


@dataclass
class Outcome:
    code: int | None
    stdout: str
    stderr: str
    timed_out: bool
    stray: list[int]
    seconds: float


def execute(env: dict[str, str], stdin: bytes, cwd: str, timeout: float, view: hs.PrivateWrites,
            argv: list[str] | None = None) -> Outcome:
    """One exec of the plugin (or of `argv`) in a session of its own, bounded, seeing
    /var/lib and /var/log through `view`."""

    def prepare() -> None:
        _limits()
        view.enter()

    started = time.monotonic()
    proc = subprocess.Popen(argv or [PLUGIN], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env, cwd=cwd, start_new_session=True, preexec_fn=prepare)
    timed_out = False
    try:
        out, err = proc.communicate(stdin, timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = proc.communicate()
    stray = hs.live_group_members(proc.pid)
    if stray:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return Outcome(None if timed_out else proc.returncode, out.decode("utf-8", "replace"),
                   err.decode("utf-8", "replace"), timed_out, stray, time.monotonic() - started)


def judge(c: Case, out: Outcome) -> list[str]:
    if out.timed_out:
        return [f"no answer within the time-out ({out.seconds:.1f} s): the plugin blocked"]
    problems = []
    if out.code != 1:
        problems.append(f"exit code {out.code}, expected 1")
    try:
        err = json.loads(out.stdout)
    except ValueError:
        problems.append(f"stdout is not exactly one JSON document: {out.stdout[:300]!r}")
        err = None
    if isinstance(err, dict):
        if not set(err) <= {"cniVersion", "code", "msg", "details"} or not isinstance(err.get("msg"), str):
            problems.append(f"stdout is not a CNI error: {out.stdout[:300]!r}")
        elif err.get("code") != c.code:
            problems.append(f"code {err.get('code')}, expected {c.code}: {err['msg'][:300]!r}")
        elif not any(t in err["msg"] for t in c.text):
            problems.append(f"msg does not name {' / '.join(c.text)!r}: {err['msg'][:300]!r}")
    elif err is not None:
        problems.append(f"stdout is not a CNI error object: {out.stdout[:300]!r}")
    for stream, text in (("stdout", out.stdout), ("stderr", out.stderr)):
        if "Traceback" in text:
            problems.append(f"a traceback on {stream}: {text[:500]!r}")
    if len(out.stderr.splitlines()) > 2:
        problems.append(f"{len(out.stderr.splitlines())} lines on stderr: {out.stderr[:500]!r}")
    if out.stray:
        problems.append(f"processes of the call still running after it answered: {out.stray}")
    return problems


def base_env(h: Hostile, ctx: LabCtx, way: str, command: str, cid: str) -> dict[str, str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "CNI_COMMAND": command,
           "CNI_PATH": f"{BIN}:{GO_PLUGINS}", "CNI_ARGS": CNI_ARGS,
           "TENANTNET_CONFIG": str(ctx.node_agent if way == "agent" else ctx.node_inproc)}
    if way == "agent":
        env["TENANTNET_AGENT_TIMEOUT"] = str(AGENT_TIMEOUT)
    if command not in ("GC", "STATUS", "VERSION"):
        env.update(CNI_CONTAINERID=cid, CNI_NETNS=ctx.values["NS"], CNI_IFNAME="net1")
    return env


def cleanup(h: Hostile, ctx: LabCtx, env: dict[str, str], conf: dict[str, Any], base: dict[str, Any],
            before: hs.NodeState, ours: set[str], cid: str) -> None:
    """Best effort after a case that changed the node: DEL as the runtime would, then by force."""
    del_env = base_env(h, ctx, "inproc", "DEL", cid)
    for key in ("CNI_CONTAINERID", "CNI_IFNAME"):
        if env.get(key):
            del_env[key] = env[key]
    del_env["CNI_NETNS"] = ""
    for doc in (conf, base):
        execute(del_env, json.dumps(doc).encode(), str(h.scratch / "cwd"), 30, h.view)
    after = ctx.state(h.netns)
    for port in after.owned_ports - before.owned_ports:
        ctx.lab.vsctl("--if-exists", "del-port", port)
    for name, alias in after.host_links.items():
        if name not in before.host_links and (name in ours or cid in alias):
            subprocess.run(["ip", "link", "delete", name], capture_output=True, check=False)
    for name in after.pod_links - before.pod_links:
        subprocess.run(["ip", "-n", h.netns, "link", "delete", name], capture_output=True, check=False)
    attachments = ctx.lab.state_dir / "attachments"
    for rel in sorted(after.records - before.records, reverse=True):
        p = attachments / rel
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
    for f in ctx.lab.hostlocal_dir.rglob("*"):
        if f.is_file() and f.name in after.allocations - before.allocations:
            f.unlink(missing_ok=True)


# Positive controls: each base config (and the allowed paths the cases bend) is accepted as it
# is, on both ways in, and DEL leaves the node as it was — so that no case passes only because
# its base was refused for some other reason.
CONTROLS = {
    "ovs": ("ovs", {}),
    "ovs-allowed-paths": ("ovs", {"configuration_path": "@OVSD@/ok.json", "ipam.resolvConf": "@RESOLV@/ok.conf",
                                  "logFile": "@LOG@/tnhx-ok-@TOK@.log"}),
    "own": ("own", {"ipam.resolvConf": "@RESOLV@/ok.conf"}),
    "sriov": ("sriov", {"runtimeConfig.CNIDeviceInfoFile": "@DEVINFO@/tnhx-ok-@TOK@.json"}),
    "gc": ("gc", {}),
}


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("control", list(CONTROLS))
def test_base_config_is_accepted(hx: Hostile, control: str, way: str, request: pytest.FixtureRequest) -> None:
    base_name, changes = CONTROLS[control]
    c = Case(f"control-{control}", 0, ("",), conf=changes, base=base_name,
             command="GC" if base_name == "gc" else "ADD", lab="nic" if base_name == "sriov" else "lab")
    h = hx
    ctx = h.ctx(c.lab, request.getfixturevalue("nic_lab" if c.lab == "nic" else "lab"))
    v = ctx.values
    cid = new_cid()
    conf = fill(apply(base_conf(c, ctx, h), c.conf), v)
    if "runtimeConfig.CNIDeviceInfoFile" in changes:  # the one name accepted: Multus's for this attachment
        conf["runtimeConfig"]["CNIDeviceInfoFile"] = f"{v['DEVINFO']}/ns1-{conf['name']}-{cid}_net1"
    before = ctx.state(h.netns)
    h.cached.pop(c.lab, None)
    h.node_cached.pop(c.lab, None)
    env = base_env(h, ctx, way, c.command, cid)
    out = execute(env, json.dumps(conf).encode(), str(h.scratch / "cwd"), 30, h.view)
    try:
        assert out.code == 0, out.stdout + out.stderr
        if c.command == "ADD":
            result = json.loads(out.stdout)
            if base_name == "ovs":
                check = {**conf, "prevResult": result}
                got = execute(base_env(h, ctx, way, "CHECK", cid), json.dumps(check).encode(),
                              str(h.scratch / "cwd"), 30, h.view)
                assert got.code == 0, got.stdout + got.stderr
            if "runtimeConfig.CNIDeviceInfoFile" in changes:
                assert Path(conf["runtimeConfig"]["CNIDeviceInfoFile"]).is_file()
    finally:
        if c.command == "ADD":
            got = execute({**base_env(h, ctx, way, "DEL", cid), "CNI_NETNS": ""}, json.dumps(conf).encode(),
                          str(h.scratch / "cwd"), 30, h.view)
            assert got.code == 0, got.stdout + got.stderr
        if "logFile" in changes:
            Path(conf["logFile"]).unlink(missing_ok=True)
    after = ctx.state(h.netns)
    assert hs.state_diff(before, after, ours=set(), container_id=cid,
                         lab_tags={_lab_tag(x.lab.root) for x in h.labs.values()}) == []
    if "runtimeConfig.CNIDeviceInfoFile" in changes:
        assert not Path(conf["runtimeConfig"]["CNIDeviceInfoFile"]).exists()  # removed on DEL


@pytest.mark.parametrize("c,way", RUNS)
def test_hostile(hx: Hostile, c: Case, way: str, request: pytest.FixtureRequest) -> None:
    from tenantnet.plugin.drivers.ovs import host_ifname

    h = hx
    ctx = h.ctx(c.lab, request.getfixturevalue("nic_lab" if c.lab == "nic" else "lab"))
    v = ctx.values
    cid = new_cid()
    env = base_env(h, ctx, way, c.command, cid)
    for key, value in c.env.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = fill(value, v)
    base = base_conf(c, ctx, h)
    conf = fill(apply(base, c.conf), v)
    stdin = c.stdin(conf) if c.stdin is not None else json.dumps(conf).encode()
    named = [s for s in _strings(conf) if "/" in s or s.startswith(".")]
    named += [env[k] for k in ("CNI_NETNS",) if env.get(k)]
    if any(".." in env.get(k, "") or "/" in env.get(k, "") for k in ("CNI_CONTAINERID", "CNI_IFNAME")):
        # where a record (or a lock) for these ids would land if they were used as path parts
        named.append(f"{ctx.lab.state_dir}/attachments/{h.net}/{env.get('CNI_CONTAINERID', '')}/"
                     f"{env.get('CNI_IFNAME', '')}.json")
    cwds = [str(h.scratch / "cwd"), os.getcwd()]
    watch = h.fs.plan(named, cwds)
    ifname = env.get("CNI_IFNAME") or "net1"
    ours = {host_ifname(env.get("CNI_CONTAINERID", cid), ifname), ifname}
    lab_tags = {_lab_tag(x.lab.root) for x in h.labs.values()}

    before = h.cached.pop(c.lab, None)
    whole_before = h.node_cached.pop(c.lab, None)
    if before is None or whole_before is None:
        fresh, fresh_whole = h.looks(ctx, state=before is None, whole=whole_before is None)
        before = fresh if before is None else before
        whole_before = fresh_whole if whole_before is None else whole_before
    served = h.agent.served() if way == "agent" else 0
    session = h.fs.begin(watch)
    out = execute(env, stdin, cwds[0], INPROC_TIMEOUT if way == "inproc" else AGENT_TIMEOUT + 4, h.view)
    hs.release_fifos(watch.named)
    problems = judge(c, out)
    if way == "agent":
        answered_well = not problems
        problems += h.agent.settle()
        # stdin over the documented 1 MiB may be refused by the shim before it is sent.
        if answered_well and len(stdin) <= 1 << 20 and h.agent.alive() and h.agent.served() <= served:
            problems.append("the request did not reach the agent (the shim answered it in-process)")
    # Files only this suite's cases lead to (a plugin opening one has read outside its
    # directories); /etc/shadow is not among them: other suites on the machine open it too.
    sensitive = {v["DECOY_ETC"], v["DECOY_ROOT"], v["OVSD"] + "-evil/ok.json", v["RESOLV"] + "-evil/ok.conf"}
    left = h.fs.end(session, mine=(cid, env.get("CNI_CONTAINERID", cid)), sensitive=sensitive)
    problems += [f"filesystem: {x}" for x in left]
    after, whole_after = h.looks(ctx)  # after the filesystem's look: they may touch the lab's files
    changed = hs.state_diff(before, after, ours=ours, container_id=env.get("CNI_CONTAINERID", cid),
                            lab_tags=lab_tags)
    problems += [f"node: {x}" for x in changed]
    whole_changed = nodestate.diff(whole_before, whole_after)
    if whole_changed:
        problems.append(f"node state (nodestate):\n{whole_changed}")
    if changed or out.code == 0:
        cleanup(h, ctx, env, conf, base, before, ours, cid)
    if left or changed or out.code == 0:
        # After the DEL: it may have made entries of its own (host-local's lock file) there.
        session.after = h.fs.snapshot(session.watch)
        h.fs.undo_created(session)
    if problems:
        _populate(ctx)  # puts back any fixture file the plugin removed or replaced
    else:
        h.cached[c.lab] = after
        h.node_cached[c.lab] = whole_after
    assert not problems, f"{c.id} via {way}:\n  " + "\n  ".join(problems)


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def _lab_tag(root: Path) -> str:
    return hashlib.sha256(os.path.abspath(str(root)).encode()).hexdigest()[:5]


def test_host_veth_carries_the_ownership_mark(hx: Hostile, lab: Lab) -> None:
    """docs/security.md: a DEL without a record acts only on links carrying this attachment's
    mark in their ifalias — so an ADD must leave the mark on the host veth it creates (the
    kernel ignores IFLA_IFALIAS in the RTM_NEWLINK that creates a link; it takes a setlink)."""
    from tenantnet.plugin.drivers.ovs import host_ifname

    h = hx
    ctx = h.ctx("lab", lab)
    cid = new_cid()
    conf = fill(base_conf(Case("mark", 0, ("",)), ctx, h), ctx.values)
    env = base_env(h, ctx, "inproc", "ADD", cid)
    out = execute(env, json.dumps(conf).encode(), str(h.scratch / "cwd"), 30, h.view)
    h.cached.pop("lab", None)
    h.node_cached.pop("lab", None)
    try:
        assert out.code == 0, out.stdout + out.stderr
        alias = hs.host_links().get(host_ifname(cid, "net1"))
        assert alias is not None and cid in alias, f"host veth alias {alias!r} carries no mark of {cid}"
    finally:
        got = execute({**base_env(h, ctx, "inproc", "DEL", cid), "CNI_NETNS": ""}, json.dumps(conf).encode(),
                      str(h.scratch / "cwd"), 30, h.view)
        assert got.code == 0, got.stdout + got.stderr


def test_watchers_count_the_calls_doing_and_nothing_else(hx: Hostile, lab: Lab) -> None:
    """The watchers attribute (issue 26). Other work on the machine while a call is watched —
    another run's files under /var/lib and /var/log (libcni's results, an IPAM store, a log),
    a Linux bridge, a veth named like an attachment's host veth, each without a hex tag — is
    not reported. What the process under test does is, whatever the name: a file an exec
    under the plugin's view writes into /var/lib/tenantnet/ipam (where other tenantnet runs
    write too) or /etc, a decoy it reads, and the host veth of an ADD left without its DEL (its peer is in our pod
    namespace)."""
    from tenantnet.plugin.drivers.ovs import host_ifname

    h = hx
    ctx = h.ctx("lab", lab)
    h.cached.pop("lab", None)
    h.node_cached.pop("lab", None)
    cid = new_cid()
    conf = json.dumps(fill(base_conf(Case("watch", 0, ("",)), ctx, h), ctx.values)).encode()
    cwd = str(h.scratch / "cwd")
    lab_tags = {_lab_tag(x.lab.root) for x in h.labs.values()}

    def observe(run: Callable[[], None]) -> tuple[hs.Session, list[str]]:
        before, whole = ctx.state(h.netns), nodestate.snapshot(ctx.lab, [h.netns])
        session = h.fs.begin(h.fs.plan([], [cwd]))
        run()
        decoys = {ctx.values["DECOY_ETC"], ctx.values["DECOY_ROOT"]}
        found = [f"filesystem: {x}" for x in h.fs.end(session, mine=(cid,), sensitive=decoys)]
        found += [f"node: {x}" for x in hs.state_diff(before, ctx.state(h.netns), ours={host_ifname(cid, "net1")},
                                                     container_id=cid, lab_tags=lab_tags)]
        whole_changed = nodestate.diff(whole, nodestate.snapshot(ctx.lab, [h.netns]))
        return session, found + ([f"node state (nodestate):\n{whole_changed}"] if whole_changed else [])

    def add(c: str) -> None:
        out = execute(base_env(h, ctx, "inproc", "ADD", c), conf, cwd, 30, h.view)
        assert out.code == 0, out.stdout + out.stderr

    def delete(c: str) -> None:
        out = execute({**base_env(h, ctx, "inproc", "DEL", c), "CNI_NETNS": ""}, conf, cwd, 30, h.view)
        assert out.code == 0, out.stdout + out.stderr

    # An ADD brings the pod's lo up, and it stays up: up before, so that the snapshots agree.
    subprocess.run(["ip", "-n", h.netns, "link", "set", "lo", "up"], check=True, capture_output=True)
    other = hs.OtherWork()

    def add_and_delete_meanwhile() -> None:
        other.start()  # removed after the call's watchers have looked
        add(cid)
        delete(cid)

    try:
        _, found = observe(add_and_delete_meanwhile)
    finally:
        other.stop()
    assert found == [], "other work was counted as the call's:\n  " + "\n  ".join(found)

    def leak() -> None:
        script = (f"mkdir -p /var/lib/tenantnet/ipam && echo leak > /var/lib/tenantnet/ipam/ipam.db-shm"
                  f" && echo x > /etc/kubernetes-{h.token} && cat {ctx.values['DECOY_ETC']} >/dev/null")
        assert execute({"PATH": os.environ.get("PATH", "/usr/bin:/bin")}, b"", cwd, 30, h.view,
                       argv=["sh", "-c", script]).code == 0

    session, found = observe(leak)
    h.fs.undo_created(session)
    assert any(x.startswith("filesystem: created /var/lib/tenantnet (in the overlay") for x in found), found
    assert any(x.startswith(f"filesystem: created /etc/kubernetes-{h.token} (in the overlay") for x in found), found
    assert f"filesystem: opened {ctx.values['DECOY_ETC']} (a read outside tenantnet's directories)" in found, found
    assert not os.path.exists("/var/lib/tenantnet/ipam/ipam.db-shm") or \
        Path("/var/lib/tenantnet/ipam/ipam.db-shm").read_bytes() != b"leak\n"  # it reached only the overlay

    try:
        _, found = observe(lambda: add(cid))
        text = "\n".join(found)
        assert f"node: host link {host_ifname(cid, 'net1')} appeared" in text, found
        assert f"+ host_links.{host_ifname(cid, 'net1')}:" in text, found  # the whole-node snapshot too
    finally:
        delete(cid)
