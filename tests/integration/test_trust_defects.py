"""Issue 11's twelve defects, each reproduced black-box as the issue describes, asserting what
docs/security.md specifies instead; and the agent under 64 hostile requests at once, and its
health report while a worker is stuck.

Every hostile call runs the real executable in its own session with bounded memory (a
plugin that reads /dev/zero dies alone, not the machine) and a time-out after which its
whole process group is killed: a defect shows as a failed assertion, never as a hung run.
Each test removes what it made (netns, links, files, mounts, processes by pid).
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import shutil
import signal
import socket
import sqlite3
import stat
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tenantnet.entry import shim
from tenantnet.lab import node as labmod
from tenantnet.lab.nic import LabVfControl
from tenantnet.plugin import nodepath
from tenantnet.plugin.drivers.ovs import host_ifname
from tests.integration import hostile_support as hs
from tests.integration.conftest import BIN, GO_PLUGINS, PLUGIN, Lab, Netns, PluginRunner, new_cid
from tests.integration.test_agent import AgentProcess, call, install_slow_ipam, shim_env
from tests.integration.test_ovs_offload import conf_for, nic, vf_snapshot
from tests.integration.test_sriov import snapshot, vfconf, vfs

CTL = str(BIN / "tenantnetctl")
MEMORY_LIMIT = 3 << 30  # address space of one hostile plugin process
AGENT_MEMORY_LIMIT = 4 << 30
SHIM_MEMORY_LIMIT = 768 << 20  # 64 shims at once, each of which could fall back in-process
HOSTILE_TIMEOUT = 20.0


# ---- node configs --------------------------------------------------------------------------

def node_settings(lab: Lab) -> dict[str, Any]:
    """The lab's node config as a mapping, for reading the directories it allows: a key
    docs/security.md added that the lab's config lacks is filled in as tenantnet/lab/node.py
    writes it."""
    data = yaml.safe_load(lab.node_config.read_text()) or {}
    root = lab.root
    data.setdefault("logFile", str(root / "log" / "tenantnet.log"))
    data.setdefault("deviceInfoDir", str(root / "devinfo"))
    data.setdefault("ipamDataDirs", [str(root / "ipam"), str(root / "host-local")])
    data.setdefault("resolvConfPaths", [str(root / "resolv.d")])
    data.setdefault("ovsConfigurationPaths", [str(root / "ovs.d")])
    if str(lab.hostlocal_dir) not in data["ipamDataDirs"]:
        data["ipamDataDirs"] = [*data["ipamDataDirs"], str(lab.hostlocal_dir)]
    return data


def write_node(path: Path, lab: Lab, **changes: Any) -> Path:
    """A private node config: the lab's, every key of it written out, with `changes`."""
    data = yaml.safe_load(lab.node_config.read_text()) or {}
    data.update(changes)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, default_flow_style=False, sort_keys=False))
    return path


def log_dir(lab: Lab) -> Path:
    return Path(node_settings(lab)["logFile"]).parent


def allowed_dir(lab: Lab, key: str) -> Path:
    """The first directory the lab's node config allows for `key` (created if missing)."""
    value = node_settings(lab)[key]
    path = Path(value[0] if isinstance(value, list) else value)
    path.mkdir(parents=True, exist_ok=True)
    return path


def tag() -> str:
    return uuid.uuid4().hex[:10]


# ---- running the plugin with bounds --------------------------------------------------------

@dataclass
class Run:
    code: int | None  # None: killed at the time-out
    out: dict[str, Any] | None
    stdout: str
    stderr: str
    elapsed: float

    def why(self) -> str:
        return f"exit {self.code} after {self.elapsed:.2f}s\nstdout: {self.stdout[:2000]}\nstderr: {self.stderr[-3000:]}"


def run_plugin(env: dict[str, str], stdin: bytes | str, timeout: float = HOSTILE_TIMEOUT,
               cwd: str | Path | None = None, memory: int = MEMORY_LIMIT,
               preexec: Callable[[], None] | None = None) -> Run:
    """One exec of the plugin in a session of its own, memory-bounded; at the time-out the
    whole session's process group (the plugin and whatever it started) is killed. `preexec`
    runs in the child before the exec (say hostile_support.stand_ins)."""
    data = stdin.encode() if isinstance(stdin, str) else stdin
    started = time.monotonic()
    proc = subprocess.Popen(["prlimit", f"--as={memory}", PLUGIN], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=cwd,
                            start_new_session=True, preexec_fn=preexec)
    code: int | None
    try:
        out, err = proc.communicate(data, timeout=timeout)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        out, err = proc.communicate()
        code = None
    elapsed = time.monotonic() - started
    _kill_group(proc.pid)  # a straggler of this call (an IPAM plugin left blocked) goes too
    stdout = out.decode(errors="replace")
    try:
        parsed = json.loads(stdout) if stdout.strip() else None
    except ValueError:
        parsed = None
    return Run(code, parsed if isinstance(parsed, dict) else None, stdout, err.decode(errors="replace"),
               elapsed)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def invoke(plugin: PluginRunner, verb: str, conf: dict[str, Any], cid: str = "", netns: str | None = "",
           ifname: str = "net1", *, stdin: bytes | None = None, cwd: str | Path | None = None,
           timeout: float = HOSTILE_TIMEOUT, preexec: Callable[[], None] | None = None,
           **env_changes: str | None) -> Run:
    """`verb` with `conf` through `plugin`'s env, bounded; a successful ADD is remembered for
    the fixture's clean-up DEL and every ADD for the no_leftovers check."""
    env = plugin.env(verb, cid, netns, ifname)
    for key, value in env_changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    if verb == "ADD":
        plugin.attempts.append(({}, env.get("CNI_CONTAINERID", ""), env.get("CNI_IFNAME", "")))
    run = run_plugin(env, stdin if stdin is not None else json.dumps(conf), timeout=timeout, cwd=cwd,
                     preexec=preexec)
    if verb == "ADD" and run.code == 0 and env.get("CNI_CONTAINERID") and env.get("CNI_IFNAME"):
        plugin.cleanups.append((tame(conf), env["CNI_CONTAINERID"], env["CNI_IFNAME"]))
    return run


def tame(conf: dict[str, Any]) -> dict[str, Any]:
    """`conf` for a clean-up DEL of our own, after a defect let a hostile ADD through:
    without the fields that name host files (so that the clean-up neither writes /etc nor
    blocks on a FIFO)."""
    out = {k: v for k, v in conf.items() if k not in ("logFile", "logLevel", "configuration_path")}
    if isinstance(out.get("runtimeConfig"), dict):
        out["runtimeConfig"] = {k: v for k, v in out["runtimeConfig"].items() if k != "CNIDeviceInfoFile"}
    if isinstance(out.get("ipam"), dict):
        out["ipam"] = {k: v for k, v in out["ipam"].items() if k != "resolvConf"}
    return out


def del_now(plugin: PluginRunner) -> None:
    """The fixture's clean-up DELs, now: while a private state directory is still there."""
    for conf, cid, ifname in list(reversed(plugin.cleanups)):
        plugin.call("DEL", conf, cid, "", ifname)
    plugin.cleanups.clear()


def assert_refused(run: Run, code: int, *words: str) -> None:
    assert run.code is not None, "no answer within the time-out: " + run.why()
    assert run.code == 1 and run.out is not None and run.out.get("code") == code, run.why()
    for word in words:
        assert word in run.out["msg"], run.out["msg"]
    assert_no_traceback(run)


def assert_no_traceback(run: Run | subprocess.CompletedProcess[str]) -> None:
    stdout, stderr = (run.stdout, run.stderr)
    assert "Traceback" not in stderr and "Traceback" not in stdout, stderr[-3000:]


def verb_request(verb: str, conf: dict[str, Any], ns: Netns) -> tuple[dict[str, Any], str, str | None]:
    """The config, container id and netns of one `verb` call as a runtime makes it."""
    if verb == "ADD":
        return conf, new_cid(), ns.path
    if verb == "DEL":
        return conf, new_cid(), ""
    if verb == "CHECK":
        prev = {"cniVersion": conf["cniVersion"], "interfaces": [{"name": "net1", "sandbox": ns.path}],
                "ips": []}
        return {**conf, "prevResult": prev}, new_cid(), ns.path
    if verb == "GC":
        return {**conf, "cniVersion": "1.1.0", "cni.dev/valid-attachments": []}, "", None
    return {**conf, "cniVersion": "1.1.0"}, "", None  # STATUS


def pod_link(ns: Netns, ifname: str = "net1") -> tuple[str, str, int, bool] | None:
    out = ns.run("ip", "-j", "link", "show", "dev", ifname)
    if out.returncode != 0:
        return None
    d = json.loads(out.stdout)[0]
    return (d["ifname"], d["address"], d["mtu"], "UP" in d["flags"])


def host_link_exists(name: str) -> bool:
    return os.path.exists(f"/sys/class/net/{name}")


def allocations_of(lab: Lab, cid: str) -> list[str]:
    """host-local's allocation files holding this container id."""
    found = []
    for f in lab.hostlocal_dir.rglob("*"):
        if f.is_file():
            try:
                if cid in f.read_text(errors="replace"):
                    found.append(str(f))
            except OSError:
                continue
    return found


def scrub(lab: Lab, cid: str, ifname: str = "net1") -> None:
    """Remove what a defective DEL could not (all named after this test's own container id),
    so that one failure does not make every later leak check of the session fail too."""
    host = host_ifname(cid, ifname)
    try:
        lab.vsctl("--if-exists", "del-port", host)
    except Exception:
        pass
    if host_link_exists(host):
        subprocess.run(["ip", "link", "delete", host], capture_output=True, check=False)
    for allocation in allocations_of(lab, cid):
        Path(allocation).unlink(missing_ok=True)
    for record in lab.records():
        if cid in record.parts:
            record.unlink(missing_ok=True)


def leftovers(lab: Lab, cid: str, ifname: str = "net1") -> list[str]:
    """What of the attachment (cid, ifname) exists: records, OVS port, host veth, addresses."""
    host = host_ifname(cid, ifname)
    left = [str(r) for r in lab.records() if cid in r.parts and r.name == f"{ifname}.json"]
    if host in lab.owned_ports():
        left.append(f"OVS port {host}")
    if host_link_exists(host):
        left.append(f"host link {host}")
    return left + allocations_of(lab, cid)


@pytest.fixture
def guard(lab: Lab, plugin: PluginRunner, no_leftovers: None) -> Iterator[None]:
    """After the test (and before no_leftovers looks): whatever an ADD of this test left
    behind is reported, then removed, so that one defect does not fail every later leak
    check of the session too."""
    yield
    leaks = []
    for _, cid, ifname in plugin.attempts:
        left = leftovers(lab, cid, ifname) if cid and ifname else []
        if left:
            leaks.append((cid[:12], ifname, left))
            scrub(lab, cid, ifname)
    assert leaks == [], f"left behind: {leaks}"


def ctl(node: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TENANTNET_CONFIG": str(node)}
    return subprocess.run([CTL, *args], env=env, capture_output=True, text=True, timeout=timeout,
                          check=False)


def remove(path: Path) -> None:
    """Remove whatever a test (or a defect) left at `path`: file, link, FIFO or directory."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path, ignore_errors=True)
        return
    if stat.S_ISFIFO(st.st_mode):
        unjam(path)
    path.unlink()


def unjam(fifo: Path) -> None:
    """Release whoever is blocked opening `fifo` for reading (a defect's victim)."""
    for _ in range(500):
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            return  # ENXIO: nobody waits on it (or it is gone)
        os.close(fd)
        time.sleep(0.005)


class FileWatch:
    """inotify on one file: did anyone open or read it while we looked?"""

    IN_ACCESS = 0x1
    IN_MODIFY = 0x2
    IN_OPEN = 0x20

    def __init__(self, path: str, mask: int) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        assert self.fd >= 0, os.strerror(ctypes.get_errno())
        wd = self._libc.inotify_add_watch(self.fd, path.encode(), mask)
        assert wd >= 0, os.strerror(ctypes.get_errno())

    def seen(self) -> int:
        mask = 0
        while True:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                return mask
            offset = 0
            while offset + 16 <= len(data):
                ev_mask = int.from_bytes(data[offset + 4:offset + 8], sys.byteorder)
                length = int.from_bytes(data[offset + 12:offset + 16], sys.byteorder)
                mask |= ev_mask
                offset += 16 + length

    def close(self) -> None:
        os.close(self.fd)


# ==== 1. root file write from a NAD =========================================================

VERBS = ["ADD", "DEL", "CHECK", "GC", "STATUS"]
BAD_LOG_FILES = ["etc", "etc-new-dir", "relative", "below-log-dir", "traversal", "bad-name",
                 "trailing-newline", "symlink-out", "fifo"]


@pytest.mark.parametrize("verb", VERBS)
@pytest.mark.parametrize("kind", BAD_LOG_FILES)
def test_1_nad_log_file_outside_the_log_directory_is_refused_and_never_created(
        lab, plugin, netns_factory, no_leftovers, guard, tmp_path, kind, verb):
    logdir = log_dir(lab)
    logdir.mkdir(parents=True, exist_ok=True)
    t = tag()
    victim = tmp_path / f"victim-{t}"
    made: list[Path] = []
    victims: list[Path]
    if kind == "etc":
        value, victims = f"/etc/tn-{t}.log", [Path(f"/etc/tn-{t}.log")]
    elif kind == "etc-new-dir":
        value, victims = f"/etc/tn-{t}/x.log", [Path(f"/etc/tn-{t}")]
    elif kind == "relative":  # would land in the runtime's cwd
        value, victims = f"tn-{t}.log", [tmp_path / f"tn-{t}.log"]
    elif kind == "below-log-dir":  # not directly in it
        value, victims = str(logdir / f"tn-{t}" / "x.log"), [logdir / f"tn-{t}"]
    elif kind == "traversal":
        value, victims = f"{logdir}/../tn-{t}.log", [logdir.parent / f"tn-{t}.log"]
    elif kind == "bad-name":
        value, victims = str(logdir / f"tn {t}.log"), [logdir / f"tn {t}.log"]
    elif kind == "trailing-newline":
        value, victims = f"{logdir}/tn-{t}.log\n", [logdir / f"tn-{t}.log\n", logdir / f"tn-{t}.log"]
    elif kind == "symlink-out":  # a name in the log directory that leads outside
        link = logdir / f"tn-{t}.log"
        link.symlink_to(victim)
        made.append(link)
        value, victims = str(link), [victim]
    else:  # a FIFO in the log directory: never opened blocking, never written
        fifo = logdir / f"tn-{t}.fifo"
        os.mkfifo(fifo)
        made.append(fifo)
        value, victims = str(fifo), []
    ns = netns_factory()
    try:
        conf, cid, netns = verb_request(verb, plugin.conf(name=f"log-{t}", logFile=value), ns)
        run = invoke(plugin, verb, conf, cid, netns, cwd=tmp_path)
        if verb == "DEL":
            # DEL must always be able to clean up (runtimes retry a failing DEL for ever):
            # it goes on, logging to the node's own file, and never opens the NAD's path.
            assert run.code == 0, run.stdout
        else:
            assert_refused(run, 7, "logFile")
        for path in victims:
            assert not os.path.lexists(path), f"{path} was created"
        if kind == "symlink-out":
            assert (logdir / f"tn-{t}.log").is_symlink()
        if kind == "fifo":
            assert stat.S_ISFIFO(os.lstat(logdir / f"tn-{t}.fifo").st_mode)
        assert pod_link(ns) is None
    finally:
        for path in [*made, *victims, logdir / f"tn-{t}.log", Path(f"/etc/tn-{t}.log"), Path(f"/etc/tn-{t}")]:
            remove(path)


def test_1_nad_log_file_in_the_log_directory_is_used_with_a_private_mode(lab, plugin, netns_factory,
                                                                       no_leftovers):
    logdir = log_dir(lab)
    path = logdir / f"nad-{tag()}.log"
    ns = netns_factory()
    cid = new_cid()
    conf = plugin.conf(name="lognet", logFile=str(path), logLevel="debug")
    try:
        inv = plugin.add(conf, ns, cid)
        assert inv.code == 0, inv.stdout
        st = os.lstat(path)
        assert stat.S_ISREG(st.st_mode) and st.st_size > 0
        assert stat.S_IMODE(st.st_mode) & ~0o640 == 0, oct(st.st_mode)
        assert plugin.call("DEL", conf, cid, ns.path).code == 0
    finally:
        del_now(plugin)
        path.unlink(missing_ok=True)


def devinfo_dir(lab: Lab) -> Path:
    path = Path(node_settings(lab)["deviceInfoDir"])
    path.mkdir(parents=True, exist_ok=True)
    return path


BAD_DEVINFO = ["etc-new-dir", "outside-existing", "traversal", "symlink-in", "symlinked-dir-in", "relative",
               "fifo-in", "directory-in"]


@pytest.mark.parametrize("kind", BAD_DEVINFO)
def test_1_device_info_file_outside_the_devinfo_directory_is_refused(nic_lab, vfp, netns_factory, tmp_path,
                                                                     kind):
    devdir = devinfo_dir(nic_lab)
    t = tag()
    victim = tmp_path / "victim.json"
    victim.write_text("precious")
    outdir = tmp_path / "outdir"
    outdir.mkdir()
    made: list[Path] = []
    absent: list[Path] = []
    if kind == "etc-new-dir":
        value = f"/etc/tn-{t}/dev.json"
        absent = [Path(f"/etc/tn-{t}")]
    elif kind == "outside-existing":
        value = str(victim)
    elif kind == "traversal":
        value = f"{devdir}/../tn-{t}.json"
        absent = [devdir.parent / f"tn-{t}.json"]
    elif kind == "symlink-in":
        (devdir / f"tn-{t}.json").symlink_to(victim)
        made.append(devdir / f"tn-{t}.json")
        value = str(devdir / f"tn-{t}.json")
    elif kind == "symlinked-dir-in":
        (devdir / f"tn-{t}").symlink_to(outdir, target_is_directory=True)
        made.append(devdir / f"tn-{t}")
        value = str(devdir / f"tn-{t}" / "dev.json")
    elif kind == "relative":
        value = "dev.json"
        absent = [tmp_path / "dev.json"]
    elif kind == "fifo-in":
        os.mkfifo(devdir / f"tn-{t}.fifo")
        made.append(devdir / f"tn-{t}.fifo")
        value = str(devdir / f"tn-{t}.fifo")
    else:
        (devdir / f"tn-{t}.d").mkdir()
        made.append(devdir / f"tn-{t}.d")
        value = str(devdir / f"tn-{t}.d")
    before = snapshot(nic_lab)
    vf = vfs(nic_lab)[1]
    ns = netns_factory()
    cid = new_cid()
    conf = vfconf(nic_lab, vf["address"], runtimeConfig={"CNIDeviceInfoFile": value})
    try:
        run = invoke(vfp, "ADD", conf, cid, ns.path, cwd=tmp_path)
        assert_refused(run, 7, "CNIDeviceInfoFile")
        assert victim.read_text() == "precious"
        assert list(outdir.iterdir()) == []
        for path in absent:
            assert not os.path.lexists(path), f"{path} was created"
        assert snapshot(nic_lab) == before and nic_lab.records() == []
        # the clean-up DEL a runtime sends after a failed ADD
        cleanup = invoke(vfp, "DEL", conf, cid, ns.path, cwd=tmp_path)
        assert cleanup.code is not None and "Traceback" not in cleanup.stderr, cleanup.why()
        assert victim.read_text() == "precious" and list(outdir.iterdir()) == []
        assert snapshot(nic_lab) == before
    finally:
        for path in [*made, *absent]:
            remove(path)


def test_1_device_info_file_inside_is_written_private_and_removed_on_del(nic_lab, vfp, netns_factory):
    devdir = devinfo_dir(nic_lab)
    vf = vfs(nic_lab)[1]
    ns = netns_factory()
    cid = new_cid()
    # The one name accepted: the one Multus gives this attachment (docs/multus.md).
    path = devdir / f"ns1-vfnet-{cid}_net1"
    conf = vfconf(nic_lab, vf["address"], runtimeConfig={"CNIDeviceInfoFile": str(path)})
    try:
        inv = vfp.add(conf, ns, cid)
        assert inv.code == 0, inv.stdout
        st = os.lstat(path)
        assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600, oct(st.st_mode)
        doc = json.loads(path.read_text())
        assert doc["type"] == "pci" and doc["pci"]["pci-address"] == vf["address"]
        assert vfp.call("DEL", conf, cid, ns.path).code == 0
        assert not path.exists(), "the device-info file outlived the attachment"
    finally:
        path.unlink(missing_ok=True)


# ==== 2. tenancy escape =====================================================================

def test_2_a_nad_cannot_put_its_vlan_on_another_tenants_bridge(lab, plugin, netns_factory, no_leftovers, guard,
                                                              tmp_path):
    """The issue's reproduction: team-b holds VLAN 100 of rail-b; a NAD of its own names
    rail-b, team-a's bridge and VLAN 100. (test_tenant_escape.py tries every such field.)"""
    other = f"br-t{tag()[:6]}"
    lab.vsctl("add-br", other, "--", "set", "Bridge", other, f"datapath_type={labmod.DATAPATH}")
    try:
        policy = {"networks": {"rail-a": {"bridge": lab.bridge}, "rail-b": {"bridge": other}},
                  "tenants": {"team-a": {"namespaces": ["team-a"], "networks": {"rail-a": {"vlans": [100]}}},
                              "team-b": {"namespaces": ["team-b"], "networks": {"rail-b": {"vlans": [100]}}}}}
        node = write_node(tmp_path / "node.yaml", lab, stateDir=str(tmp_path / "state"), tenancy=policy)
        plugin.extra_env["TENANTNET_CONFIG"] = str(node)
        team_b = "IgnoreUnknown=1;K8S_POD_NAMESPACE=team-b;K8S_POD_NAME=p1"
        ns = netns_factory()
        escape = plugin.conf(name="rail-b", bridge=lab.bridge, vlan=100, ipam=None)
        inv = plugin.add(escape, ns, new_cid(), cni_args=team_b)
        assert inv.code == 1 and inv.out is not None and inv.out["code"] == 120, inv.stdout
        assert "bridge" in inv.out["msg"], inv.out["msg"]
        assert lab.owned_ports() == [] and pod_link(ns) is None
        # the same NAD without the bridge: the declared one, with team-b's VLAN
        own = plugin.conf(name="rail-b", bridge=None, vlan=100, ipam=None)
        cid = new_cid()
        inv = plugin.add(own, ns, cid, cni_args=team_b)
        assert inv.code == 0, inv.stdout
        host = inv.out["interfaces"][0]["name"]
        assert lab.vsctl("port-to-br", host).strip() == other
        assert lab.vsctl("get", "Port", host, "tag").strip() == "100"
        assert plugin.call("DEL", own, cid, ns.path, cni_args=team_b).code == 0
    finally:
        lab.vsctl("--if-exists", "del-br", other)


# ==== 3. fork bomb: ipam.type naming tenantnet ==============================================

def session_size(sid: int) -> int:
    """How many processes are in session `sid` right now."""
    count = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 3 and int(fields[3]) == sid:
            count += 1
    return count


def run_watched(env: dict[str, str], stdin: str, limit_s: float = 15.0, storm: int = 12) -> tuple[Run, int]:
    """Run the plugin, counting the processes of its session every few ms; a storm (more
    than `storm` at once) or `limit_s` ends it by killing the session's group."""
    started = time.monotonic()
    proc = subprocess.Popen([PLUGIN], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env, start_new_session=True)
    result: dict[str, bytes] = {}

    def talk() -> None:
        result["out"], result["err"] = proc.communicate(stdin.encode())

    talker = threading.Thread(target=talk, daemon=True)
    talker.start()
    peak = 0
    killed = False
    while talker.is_alive():
        peak = max(peak, session_size(proc.pid))
        if peak > storm or time.monotonic() - started > limit_s:
            _kill_group(proc.pid)
            killed = True
            break
        time.sleep(0.01)
    talker.join(timeout=30)
    _kill_group(proc.pid)
    out = result.get("out", b"").decode(errors="replace")
    try:
        parsed = json.loads(out) if out.strip() else None
    except ValueError:
        parsed = None
    return Run(None if killed else proc.returncode, parsed, out, result.get("err", b"").decode(errors="replace"),
               time.monotonic() - started), peak


@pytest.mark.parametrize("how", ["by-name", "symlink-to-it", "delegate-chain"])
def test_3_ipam_type_tenantnet_is_refused_promptly_without_a_process_storm(lab, plugin, netns_factory,
                                                                         no_leftovers, guard, tmp_path, how):
    cni_dir = tmp_path / "cni"
    cni_dir.mkdir()
    ipam_type = "tenantnet"
    if how == "symlink-to-it":
        (cni_dir / "my-ipam").symlink_to(PLUGIN)
        ipam_type = "my-ipam"
    elif how == "delegate-chain":  # not tenantnet by name or path, but it runs tenantnet
        script = cni_dir / "chain-ipam"
        script.write_text(f"#!/bin/sh\nexec {PLUGIN} \"$@\"\n")
        script.chmod(0o755)
        ipam_type = "chain-ipam"
    plugin.extra_env["CNI_PATH"] = f"{cni_dir}:{BIN}:{GO_PLUGINS}"
    ns = netns_factory()
    cid = new_cid()
    conf = plugin.conf(name="bomb", ipam={"type": ipam_type, "ranges": [[{"subnet": "10.78.0.0/24"}]],
                                          "dataDir": str(lab.hostlocal_dir)})
    plugin.attempts.append(({}, cid, "net1"))
    # 45 s before the kill: the wait to rule out is a delegate IPAM exec that never answers,
    # which the plugin gives up on only after its EXEC_TIMEOUT (60 s).
    add, peak = run_watched(plugin.env("ADD", cid, ns.path, "net1"), json.dumps(conf), limit_s=45)
    if add.code == 0:  # a defect: undo it without running that IPAM again
        plugin.cleanups.append(({k: v for k, v in conf.items() if k != "ipam"}, cid, "net1"))
    assert add.code is not None, f"ADD had to be killed ({peak} processes at once): " + add.why()
    assert peak <= 4, f"{peak} processes in the ADD's session"
    # Refused, not after waiting out a delegate (60 s): 30 s is far from both that and the
    # second or two a refused exec takes, on any load.
    assert add.elapsed < 30, add.why()
    if how == "delegate-chain":
        # the inner tenantnet refuses to be anyone's delegate; the outer ADD fails and rolls back
        assert add.code == 1 and add.out is not None and add.out["code"] not in (0, 100), add.why()
        assert_no_traceback(add)
    else:
        assert_refused(add, 7, "ipam.type")
    assert pod_link(ns) is None
    delete, peak = run_watched(plugin.env("DEL", cid, ns.path, "net1"), json.dumps(conf), limit_s=45)
    assert delete.code == 0, f"DEL ({peak} processes at once): " + delete.why()
    assert peak <= 4 and delete.elapsed < 30  # as the ADD's


# ==== 4. agent denial of service: FIFOs, devices, /etc/shadow ===============================

HOSTILE_FILES = ["fifo", "dev-zero", "symlink-to-dev-zero", "directory", "too-big", "etc-shadow",
                 "outside-secret"]
FILE_FIELDS = ["configuration_path", "resolvConf-host-local", "resolvConf-tenantnet-ipam"]


def _file_field_conf(plugin: PluginRunner, lab: Lab, field: str, path: str) -> dict[str, Any]:
    if field == "configuration_path":
        return plugin.conf(name="files", configuration_path=path)
    if field == "resolvConf-host-local":
        return plugin.conf(name="files", ipam={"type": "host-local", "ranges": [[{"subnet": "10.79.0.0/24"}]],
                                               "dataDir": str(lab.hostlocal_dir), "resolvConf": path})
    return plugin.conf(name="files", ipam={"type": "tenantnet-ipam", "ranges": [[{"subnet": "10.79.0.0/24"}]],
                                           "dataDir": str(allowed_dir(lab, "ipamDataDirs")), "resolvConf": path})


@pytest.mark.parametrize("kind", HOSTILE_FILES)
@pytest.mark.parametrize("field", FILE_FIELDS)
def test_4_hostile_files_are_refused_at_once_and_never_read(lab, plugin, netns_factory, no_leftovers, guard, tmp_path,
                                                            field, kind):
    key = "ovsConfigurationPaths" if field == "configuration_path" else "resolvConfPaths"
    allowed = allowed_dir(lab, key)
    t = tag()
    made: list[Path] = []
    watch: FileWatch | None = None
    watch_mask = 0
    watched: Path | None = None  # the file the watch is on (path itself, or its stand-in)
    preexec = None
    if kind == "fifo":
        path = allowed / f"tn-{t}.fifo"
        os.mkfifo(path)
    elif kind == "dev-zero":
        path = Path("/dev/zero")
    elif kind == "symlink-to-dev-zero":
        path = allowed / f"tn-{t}.zero"
        path.symlink_to("/dev/zero")
    elif kind == "directory":
        path = allowed / f"tn-{t}.d"
        path.mkdir()
    elif kind == "too-big":  # a regular file in the right place, over the 64 KiB bound
        path = allowed / f"tn-{t}.json"
        path.write_text(json.dumps({"socket_file": lab.ovsdb, "pad": "x" * (100 << 10)}))
    elif kind == "etc-shadow":
        # Other work on the machine reads /etc/shadow: the plugin sees a stand-in of ours
        # there (a bind mount in a mount namespace of its own), and the watch is on that.
        path = Path("/etc/shadow")
        watched = tmp_path / "shadow"
        watched.write_text("root:*:20000:0:99999:7:::\n")
        watched.chmod(0o640)
        preexec = hs.stand_ins({str(path): str(watched)})
        watch_mask = FileWatch.IN_ACCESS | FileWatch.IN_MODIFY
    else:  # a file of the admin's, outside the allowed directories
        path = tmp_path / "secret.conf"
        path.write_text('{"socket_file": "unix:/nowhere"}\nnameserver 192.0.2.53\n')
        watch_mask = FileWatch.IN_OPEN | FileWatch.IN_ACCESS | FileWatch.IN_MODIFY
    if path.parent == allowed:
        made.append(path)
    ns = netns_factory()
    baseline = invoke(plugin, "ADD", plugin.conf(name="files", vlan=5000), new_cid(), ns.path)
    assert_refused(baseline, 7, "vlan")
    try:
        if watch_mask:
            watch = FileWatch(str(watched or path), watch_mask)
        run = invoke(plugin, "ADD", _file_field_conf(plugin, lab, field, str(path)), new_cid(), ns.path,
                     preexec=preexec)
        if watch is not None:
            seen = watch.seen()
            assert seen == 0, f"{path} was opened or read (inotify mask {seen:#x})"
        assert_refused(run, 7, field.split("-")[0])
        # At once: a blocking open or read of the FIFO or device ends only at the 20 s kill
        # (HOSTILE_TIMEOUT); 10 s over the baseline (the same exec, refused on another field)
        # stays clear of that kill and of load (1 s was within one loaded exec's jitter).
        assert run.elapsed < baseline.elapsed + 10, f"{run.elapsed:.2f}s against {baseline.elapsed:.2f}s"
        assert pod_link(ns) is None
    finally:
        if watch is not None:
            watch.close()
        for p in made:
            remove(p)


def test_4_the_shadow_watch_sees_the_process_under_test_and_nobody_else(tmp_path):
    """The /etc/shadow case's watch attributes: a read of /etc/shadow by another process on the
    machine (they happen all the time) is not seen; a read by a process run the way the plugin
    is (run_plugin with the stand-in) is, though it names the real path."""
    standin = tmp_path / "shadow"
    standin.write_text("root:*:20000:0:99999:7:::\n")
    standin.chmod(0o640)
    watch = FileWatch(str(standin), FileWatch.IN_ACCESS | FileWatch.IN_MODIFY)
    try:
        Path("/etc/shadow").read_bytes()  # another process's read, as far as the watch knows
        subprocess.run(["cat", "/etc/shadow"], capture_output=True, check=True)
        assert watch.seen() == 0
        read = subprocess.run(["cat", "/etc/shadow"], capture_output=True, check=True,
                              preexec_fn=hs.stand_ins({"/etc/shadow": str(standin)}))
        assert read.stdout == standin.read_bytes()  # the stand-in is what it saw
        assert watch.seen() & FileWatch.IN_ACCESS
    finally:
        watch.close()


# ==== 5. a stale DEL breaks another pod =====================================================

def test_5_sriov_stale_and_cleanup_dels_leave_the_next_pods_vf_alone(nic_lab, vfp, netns_factory):
    before = snapshot(nic_lab)
    vf = vfs(nic_lab)[2]
    ctl_vf = LabVfControl(str(nic_lab.root))
    a_ns, b_ns, c_ns = netns_factory(), netns_factory(), netns_factory()
    a_cid, b_cid, c_cid = new_cid(), new_cid(), new_cid()
    conf_a = vfconf(nic_lab, vf["address"], vlan=100, mac="02:5a:00:00:00:0a")
    conf_b = vfconf(nic_lab, vf["address"], vlan=200, mac="02:5b:00:00:00:0b", ipam=None)
    conf_c = vfconf(nic_lab, vf["address"], vlan=300, mac="02:5c:00:00:00:0c", ipam=None)

    assert vfp.add(conf_a, a_ns, a_cid).code == 0
    assert vfp.call("DEL", conf_a, a_cid, a_ns.path).code == 0
    assert snapshot(nic_lab) == before
    add_b = vfp.add(conf_b, b_ns, b_cid)
    assert add_b.code == 0, add_b.stdout
    b_vf = ctl_vf.read("lpf0", vf["index"]).to_dict()
    b_link = pod_link(b_ns)
    assert b_vf["vlan"] == 200 and b_vf["mac"] == "02:5b:00:00:00:0b"
    assert b_link is not None and b_link[1] == "02:5b:00:00:00:0b"

    def b_intact(after: str) -> None:
        assert ctl_vf.read("lpf0", vf["index"]).to_dict() == b_vf, f"B's VF changed by {after}"
        assert pod_link(b_ns) == b_link, f"B's interface changed by {after}"
        check = vfp.call("CHECK", {**conf_b, "prevResult": add_b.out}, b_cid, b_ns.path)
        assert check.code == 0, f"after {after}: {check.stdout}"

    # containerd's second DEL for A: no netns, the config (Multus re-read it) still names the VF
    assert vfp.call("DEL", conf_a, a_cid, "").code == 0
    b_intact("a repeated DEL of A without netns")
    assert vfp.call("DEL", conf_a, a_cid, a_ns.path).code == 0
    b_intact("a repeated DEL of A with its netns")
    # pod C asks for the VF B holds: refused, and the runtime's clean-up DEL must not touch B
    refused = vfp.add(conf_c, c_ns, c_cid)
    assert refused.code == 1 and refused.out["code"] == 7, refused.stdout
    assert vfp.call("DEL", conf_c, c_cid, c_ns.path).code == 0
    b_intact("the clean-up DEL of C's refused ADD")
    assert vfp.call("DEL", conf_c, c_cid, "").code == 0
    b_intact("a second clean-up DEL of C")

    assert vfp.call("DEL", conf_b, b_cid, b_ns.path).code == 0
    first = snapshot(nic_lab)
    assert first == before
    # repeated DELs with no other pod: nothing changes after the first
    for conf, cid, netns in ((conf_b, b_cid, ""), (conf_b, b_cid, b_ns.path), (conf_a, a_cid, ""),
                             (conf_c, c_cid, "")):
        assert vfp.call("DEL", conf, cid, netns).code == 0
        assert snapshot(nic_lab) == first, f"a repeated DEL of {cid[:8]} changed the VF"
    assert nic_lab.records() == []


def representor_port(lab: Lab, name: str) -> tuple[Any, dict[str, str]] | None:
    rows = json.loads(lab.vsctl("--format=json", "--columns=tag,external_ids", "find", "Port", f"name={name}"))
    if not rows["data"]:
        return None
    tag_value, ids = rows["data"][0]
    return tag_value, dict(ids[1])


def test_5_ovs_offload_stale_and_cleanup_dels_leave_the_next_pods_port_alone(switchdev_lab, off,
                                                                          netns_factory):
    before = vf_snapshot(switchdev_lab)
    card = nic(switchdev_lab)
    vf = card["vfs"][1]
    ctl_vf = LabVfControl(str(switchdev_lab.root))
    a_ns, b_ns, c_ns = netns_factory(), netns_factory(), netns_factory()
    a_cid, b_cid, c_cid = new_cid(), new_cid(), new_cid()
    conf_a = conf_for(switchdev_lab, vf, vlan=100, mac="02:6a:00:00:00:0a")
    conf_b = conf_for(switchdev_lab, vf, vlan=200, mac="02:6b:00:00:00:0b", ipam=None)
    conf_c = conf_for(switchdev_lab, vf, vlan=300, mac="02:6c:00:00:00:0c", ipam=None)

    assert off.add(conf_a, a_ns, a_cid).code == 0
    assert off.call("DEL", conf_a, a_cid, a_ns.path).code == 0
    add_b = off.add(conf_b, b_ns, b_cid)
    assert add_b.code == 0, add_b.stdout
    rep = add_b.out["interfaces"][0]["name"]
    assert rep == vf["representor"]
    b_port = representor_port(switchdev_lab, rep)
    assert b_port is not None and b_port[0] == 200 and b_port[1]["tenantnet-container-id"] == b_cid
    b_vf = ctl_vf.read(card["pf"], vf["index"]).to_dict()
    b_link = pod_link(b_ns)
    assert b_link is not None and b_link[1] == "02:6b:00:00:00:0b"

    def b_intact(after: str) -> None:
        assert representor_port(switchdev_lab, rep) == b_port, f"B's representor port changed by {after}"
        assert ctl_vf.read(card["pf"], vf["index"]).to_dict() == b_vf, f"B's VF changed by {after}"
        assert pod_link(b_ns) == b_link, f"B's interface changed by {after}"

    assert off.call("DEL", conf_a, a_cid, "").code == 0
    b_intact("a repeated DEL of A without netns")
    refused = off.add(conf_c, c_ns, c_cid)
    assert refused.code == 1 and refused.out["code"] == 7, refused.stdout
    assert off.call("DEL", conf_c, c_cid, c_ns.path).code == 0
    b_intact("the clean-up DEL of C's refused ADD")
    assert off.call("DEL", conf_c, c_cid, "").code == 0
    b_intact("a second clean-up DEL of C")

    assert off.call("DEL", conf_b, b_cid, b_ns.path).code == 0
    first = vf_snapshot(switchdev_lab)
    assert first == before and switchdev_lab.owned_ports() == []
    for conf, cid in ((conf_b, b_cid), (conf_a, a_cid), (conf_c, c_cid)):
        assert off.call("DEL", conf, cid, "").code == 0
        assert vf_snapshot(switchdev_lab) == first
    assert switchdev_lab.owned_ports() == [] and switchdev_lab.records() == []


# ==== 6. a corrupt record blocks DEL forever ================================================

CORRUPTIONS: dict[str, Callable[[dict[str, Any]], str]] = {
    "string": lambda rec: '"x"',
    "number": lambda rec: "5",
    "null": lambda rec: "null",
    "plan-not-an-object": lambda rec: json.dumps({**rec, "plan": 3}),
    "pod-not-an-object": lambda rec: json.dumps({**rec, "pod": "ns1/pod1"}),
    "newer-format": lambda rec: json.dumps({**rec, "format": 999}),
    "truncated": lambda rec: json.dumps(rec)[:40],
}


def _files(directory: Path) -> set[Path]:
    return {p for p in directory.rglob("*") if p.is_file()} if directory.exists() else set()


@pytest.mark.parametrize("verb", ["DEL", "GC"])
@pytest.mark.parametrize("kind", list(CORRUPTIONS))
def test_6_corrupt_record_is_quarantined_and_teardown_proceeds(lab, plugin, netns_factory, no_leftovers,
                                                               kind, verb):
    ns = netns_factory()
    cid = new_cid()
    conf = plugin.conf(name=f"corrupt-{tag()[:8]}")
    add = plugin.add(conf, ns, cid)
    assert add.code == 0, add.stdout
    (record,) = [p for p in lab.records() if cid in p.parts]
    quarantine = lab.state_dir / "quarantine"
    earlier = _files(quarantine)
    bad = CORRUPTIONS[kind](json.loads(record.read_text()))
    record.write_text(bad)
    try:
        listed = ctl(lab.node_config, "ls")
        assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed.stderr
        assert "corrupt" in (listed.stdout + listed.stderr).lower(), listed
        if verb == "DEL":
            inv = plugin.call("DEL", conf, cid, ns.path)
        else:
            gc = {**conf, "cniVersion": "1.1.0", "cni.dev/valid-attachments": []}
            inv = plugin.raw(plugin.env("GC", netns=None, cni_args=""), json.dumps(gc))
        assert inv.code == 0, inv.stdout
        assert "Traceback" not in inv.stderr
        host = host_ifname(cid, "net1")
        assert host not in lab.owned_ports() and not host_link_exists(host)
        assert pod_link(ns) is None and allocations_of(lab, cid) == []
        assert not record.exists()
        moved = _files(quarantine) - earlier
        assert any(p.read_text(errors="replace") == bad for p in moved), \
            f"the bad record is not under {quarantine}: {sorted(moved)}"
        listed = ctl(lab.node_config, "ls")
        assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed.stderr
        assert "corrupt" in (listed.stdout + listed.stderr).lower(), listed
        assert plugin.call("DEL", conf, cid, "").code == 0  # and DEL stays idempotent
    finally:
        for p in _files(quarantine) - earlier:
            p.unlink()
        scrub(lab, cid)


# ==== 7. host network namespace accepted ====================================================

NOT_A_POD_NETNS = ["proc-self-net", "proc-1-net", "uts-namespace", "regular-file", "directory", "dev-null"]


@pytest.mark.parametrize("verb", ["ADD", "CHECK"])
@pytest.mark.parametrize("kind", NOT_A_POD_NETNS)
def test_7_host_netns_and_non_netns_paths_are_refused_with_code_4(lab, plugin, no_leftovers, guard, tmp_path,
                                                                   kind, verb):
    path = {"proc-self-net": "/proc/self/ns/net", "proc-1-net": "/proc/1/ns/net",
            "uts-namespace": "/proc/self/ns/uts", "regular-file": str(tmp_path / "netns"),
            "directory": str(tmp_path), "dev-null": "/dev/null"}[kind]
    if kind == "regular-file":
        Path(path).write_text("")
    ifname = f"tnh{tag()[:8]}"  # unique: if it lands in the host, it is ours to remove
    cid = new_cid()
    conf = plugin.conf(name="hostns")
    if verb == "CHECK":
        conf["prevResult"] = {"cniVersion": "1.0.0", "interfaces": [{"name": ifname, "sandbox": path}], "ips": []}
    try:
        run = invoke(plugin, verb, conf, cid, path, ifname)
        assert_refused(run, 4, "CNI_NETNS")
        assert not host_link_exists(ifname), f"{ifname} appeared in the host namespace"
    finally:
        if host_link_exists(ifname):
            subprocess.run(["ip", "link", "delete", ifname], capture_output=True, check=False)


# ==== 8. races and rollback =================================================================

def attachment_state(lab: Lab, ns: Netns, cid: str, ifname: str = "net1") -> dict[str, bool]:
    host = host_ifname(cid, ifname)
    return {
        "record": any(cid in p.parts for p in lab.records()),
        "host veth": host_link_exists(host),
        "OVS port": host in lab.owned_ports(),
        "IP allocation": bool(allocations_of(lab, cid)),
        "pod interface": pod_link(ns, ifname) is not None,
    }


def _start(env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([PLUGIN], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env)


def test_8_racing_add_and_del_end_with_everything_or_nothing(lab, plugin, netns_factory, no_leftovers):
    import random

    ns = netns_factory()
    conf = plugin.conf(name="race")
    stdin = json.dumps(conf).encode()
    started = time.monotonic()
    cid = new_cid()
    assert plugin.add(conf, ns, cid).code == 0
    add_time = time.monotonic() - started
    assert plugin.call("DEL", conf, cid, ns.path).code == 0
    rng = random.Random(11)
    outcomes = []
    used: list[str] = []
    try:
        _race_rounds(lab, plugin, ns, conf, stdin, add_time, rng, outcomes, used)
    finally:
        for cid in used:
            scrub(lab, cid)


def _race_rounds(lab: Lab, plugin: PluginRunner, ns: Netns, conf: dict[str, Any], stdin: bytes,
                 add_time: float, rng: Any, outcomes: list[bool], used: list[str]) -> None:
    for round_no in range(14):
        cid = new_cid()
        used.append(cid)
        plugin.attempts.append(({}, cid, "net1"))
        plugin.cleanups.append((conf, cid, "net1"))
        add = _start(plugin.env("ADD", cid, ns.path, "net1"))
        delete = _start(plugin.env("DEL", cid, ns.path if round_no % 2 else "", "net1"))
        # Both interpreters start together; the DEL's request goes in somewhere inside the ADD.
        add_first = round_no % 3 != 2
        first, second = (add, delete) if add_first else (delete, add)
        first.stdin.write(stdin)
        first.stdin.close()
        time.sleep(rng.uniform(0, add_time))
        second.stdin.write(stdin)
        second.stdin.close()
        codes = []
        for proc in (add, delete):
            proc.wait(timeout=120)
            out = proc.stdout.read().decode()
            err = proc.stderr.read().decode()
            proc.stdout.close()
            proc.stderr.close()
            codes.append((proc.returncode, out.strip()[:300]))
            assert "Traceback" not in err, err
        assert codes[1][0] == 0, f"round {round_no}: DEL failed: {codes[1]}"
        state = attachment_state(lab, ns, cid)
        assert len(set(state.values())) == 1, f"round {round_no}: half an attachment left: {state} ({codes})"
        outcomes.append(all(state.values()))
        if all(state.values()):
            assert codes[0][0] == 0, f"round {round_no}: an attachment without a successful ADD: {codes}"
        assert plugin.call("DEL", conf, cid, ns.path).code == 0
        state = attachment_state(lab, ns, cid)
        assert not any(state.values()), f"round {round_no}: the final DEL left {state}"


@pytest.fixture
def tiny_state_fs(lab: Lab) -> Iterator[Path]:
    """A private 4 MiB tmpfs, unmounted afterwards (also when the test fails). It is mounted
    inside a directory the lab's node config allows for IPAM data, so that an IPAM store
    can live on the same full file system as the state directory."""
    mount_point = Path(tempfile.mkdtemp(prefix="tnt-fs-", dir=allowed_dir(lab, "ipamDataDirs")))
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", str(mount_point)],
                   check=True, capture_output=True)
    try:
        yield mount_point
    finally:
        if subprocess.run(["umount", str(mount_point)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mount_point)], capture_output=True)
        os.rmdir(mount_point)


def fill(directory: Path, leave: int = 0) -> Path:
    """Fill the file system of `directory` with one file, leaving about `leave` bytes free."""
    filler = directory / f"filler-{tag()}"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for size in (1 << 20, 4096, 512, 1):
            block = b"\0" * size
            while True:
                try:
                    if os.write(fd, block) < size:
                        break
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
        if leave:
            os.ftruncate(fd, max(os.fstat(fd).st_size - leave, 0))
    finally:
        os.close(fd)
    return filler


def test_8_failed_add_on_a_full_state_filesystem_leaves_nothing(lab, plugin, netns_factory, no_leftovers,
                                                               tiny_state_fs, tmp_path):
    state = tiny_state_fs / "state"
    node = write_node(tmp_path / "node.yaml", lab, stateDir=str(state))
    plugin.extra_env["TENANTNET_CONFIG"] = str(node)
    ns = netns_factory()
    conf = plugin.conf(name="fullfs")
    warm = new_cid()  # the state directory as a node has it: made, used once
    assert plugin.add(conf, ns, warm).code == 0
    assert plugin.call("DEL", conf, warm, ns.path).code == 0
    cid = new_cid()
    filler = fill(tiny_state_fs)
    try:
        assert os.statvfs(tiny_state_fs).f_bavail * os.statvfs(tiny_state_fs).f_frsize < 64 << 10
        inv = plugin.add(conf, ns, cid)
        assert inv.code == 1 and inv.out["code"] == 5, inv.stdout
        assert "Traceback" not in inv.stderr
        host = host_ifname(cid, "net1")
        assert host not in lab.owned_ports() and not host_link_exists(host)
        assert allocations_of(lab, cid) == [] and pod_link(ns) is None
        assert [p for p in (state / "attachments").rglob("*.json")] == []
        assert plugin.call("DEL", conf, cid, ns.path).code == 0
    finally:
        filler.unlink()
        del_now(plugin)
        scrub(lab, cid)
    assert [p for p in (state / "attachments").rglob("*") if p.is_file()] == []


def test_8_add_at_every_fill_level_either_completes_or_leaves_nothing(lab, plugin, netns_factory,
                                                                     tiny_state_fs, tmp_path):
    """The IPAM store on the same full file system too (tenantnet-ipam's dataDir there): the
    rollback's release must still get through."""
    state = tiny_state_fs / "state"
    ipam_dir = tiny_state_fs / "ipam"
    node = write_node(tmp_path / "node.yaml", lab, stateDir=str(state))
    plugin.extra_env["TENANTNET_CONFIG"] = str(node)
    ns = netns_factory()
    conf = plugin.conf(name="fulldb", ipam={"type": "tenantnet-ipam", "ranges": [[{"subnet": "10.81.0.0/24"}]],
                                            "dataDir": str(ipam_dir)})
    warm = new_cid()
    assert plugin.add(conf, ns, warm).code == 0
    assert plugin.call("DEL", conf, warm, ns.path).code == 0
    failures = 0
    used: list[str] = []
    try:
        failures = _fill_levels(lab, plugin, ns, conf, tiny_state_fs, state, ipam_dir, used)
    finally:
        del_now(plugin)
        for cid in used:
            scrub(lab, cid)
    assert failures, "no fill level made ADD fail: the test did not test anything"


def _fill_levels(lab: Lab, plugin: PluginRunner, ns: Netns, conf: dict[str, Any], fs: Path, state: Path,
                 ipam_dir: Path, used: list[str]) -> int:
    def nothing_left(what: str) -> None:
        host = host_ifname(cid, "net1")
        assert host not in lab.owned_ports() and not host_link_exists(host), what
        assert pod_link(ns) is None, what
        assert [p for p in (state / "attachments").rglob("*.json")] == [], what
        with sqlite3.connect(ipam_dir / "ipam.db") as db:
            held = db.execute("SELECT count(*) FROM allocation").fetchone()[0]
        assert held == 0, f"{what}: {held} addresses still allocated"

    failures = 0
    for leave in (0, 2 << 10, 4 << 10, 8 << 10, 12 << 10, 16 << 10, 24 << 10, 32 << 10, 64 << 10, 128 << 10):
        cid = new_cid()
        used.append(cid)
        filler = fill(fs, leave)
        try:
            inv = plugin.add(conf, ns, cid)
        finally:
            filler.unlink()
        if inv.code == 0:
            assert plugin.call("DEL", conf, cid, ns.path).code == 0
            nothing_left(f"{leave} bytes free, after ADD and DEL")
            continue
        failures += 1
        nothing_left(f"{leave} bytes free, after the failed ADD ({inv.stdout.strip()})")
        assert inv.out is not None and inv.out["code"] != 100, f"{leave} bytes free: {inv.stdout}"
        assert "Traceback" not in inv.stderr, inv.stderr
        cleanup = plugin.call("DEL", conf, cid, ns.path)  # the runtime's clean-up
        assert cleanup.code == 0, f"{leave} bytes free, the clean-up DEL: {cleanup.stdout}"
    return failures


# ==== 9. hostile input gives internal errors ================================================

def _nested(depth: int, inside: bool = True) -> bytes:
    deep = "[" * depth + "]" * depth
    if not inside:
        return deep.encode()
    return ('{"cniVersion": "1.0.0", "name": "deep", "type": "tenantnet", "bridge": "br-lab", "x": '
            + deep + "}").encode()


def _var_log_tenantnet() -> dict[str, tuple[int, int]] | None:
    root = Path("/var/log/tenantnet")
    if not root.exists():
        return None
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}


DECODE_BOMBS = {
    "array-100000-deep-inside": lambda: _nested(100000),
    "array-100000-deep-top": lambda: _nested(100000, inside=False),
    "object-100000-deep": lambda: b'{"a":' * 100000 + b"1" + b"}" * 100000,
    "array-200-deep": lambda: _nested(200),
    "stdin-over-1MiB": lambda: json.dumps({"cniVersion": "1.0.0", "name": "big", "type": "tenantnet",
                                           "bridge": "br-lab", "pad": "x" * (1100 << 10)}).encode(),
}


@pytest.mark.parametrize("verb", ["ADD", "DEL"])
@pytest.mark.parametrize("kind", list(DECODE_BOMBS))
def test_9_decode_bombs_get_code_6(lab, plugin, netns_factory, no_leftovers, guard, kind, verb):
    before = _var_log_tenantnet()
    ns = netns_factory()
    run = invoke(plugin, verb, {}, new_cid(), ns.path if verb == "ADD" else "", stdin=DECODE_BOMBS[kind]())
    assert_refused(run, 6)
    assert _var_log_tenantnet() == before, "the default log directory was written"
    assert pod_link(ns) is None


def test_9_moderate_nesting_and_size_are_fine(lab, plugin, netns_factory, no_leftovers, guard):
    ns = netns_factory()
    for extra in ({"x": json.loads("[" * 30 + "]" * 30)}, {"pad": "x" * (512 << 10)}):
        cid = new_cid()
        inv = plugin.add(plugin.conf(name="fine", **extra), ns, cid)
        assert inv.code == 0, inv.stdout[:500]
        assert plugin.call("DEL", plugin.conf(name="fine", **extra), cid, ns.path).code == 0


class FakeOvsdb:
    """A unix socket that is not OVSDB: answers garbage, closes at once, or says nothing."""

    def __init__(self, path: str, behaviour: str) -> None:
        self.path = path
        self.behaviour = behaviour
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.conns: list[socket.socket] = []
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None
        if behaviour != "not-listening":
            self.sock.listen(16)
            self.sock.settimeout(0.1)
            self.thread = threading.Thread(target=self._serve, daemon=True)
            self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            if self.behaviour == "garbage":
                try:
                    conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n\x00\xff{]")
                except OSError:
                    pass
                conn.close()
            elif self.behaviour == "closing":
                conn.close()
            else:
                self.conns.append(conn)  # silent: holds the connection, never answers

    def close(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(timeout=5)
        for conn in self.conns:
            conn.close()
        self.sock.close()


@pytest.mark.parametrize("allowed_as", ["ovsdbEndpoints", "node-ovsdb"])
@pytest.mark.parametrize("spelling", ["unix", "bare-path"])
@pytest.mark.parametrize("behaviour", ["garbage", "closing", "silent", "not-listening"])
def test_9_socket_file_that_is_not_ovsdb_gives_a_clear_error(lab, plugin, netns_factory, no_leftovers, guard,
                                                              tmp_path, behaviour, spelling, allowed_as):
    sock_dir = Path(tempfile.mkdtemp(prefix="tnt-sk-"))
    path = str(sock_dir / "db.sock")
    fake = FakeOvsdb(path, behaviour)
    # A silent server is given up on only at the node's ovsdbTimeout, which the test waits
    # out: a quarter second for it (nodeconfig accepts 0.1 to 120). The others answer, close or
    # refuse at once and keep 1 s, so that it is their answer, not the bound, that is judged.
    bound = 0.25 if behaviour == "silent" else 1
    try:
        if allowed_as == "ovsdbEndpoints":  # the connection is attempted only to an allowed endpoint
            node = write_node(tmp_path / "node.yaml", lab, ovsdbEndpoints=[f"unix:{path}"], ovsdbTimeout=bound)
        else:
            node = write_node(tmp_path / "node.yaml", lab, ovsdb=f"unix:{path}", ovsdbTimeout=bound,
                              stateDir=str(tmp_path / "state"))
        plugin.extra_env["TENANTNET_CONFIG"] = str(node)
        ns = netns_factory()
        socket_file = f"unix:{path}" if spelling == "unix" else path
        run = invoke(plugin, "ADD", plugin.conf(name="fakedb", socket_file=socket_file), new_cid(), ns.path)
        assert run.code == 1 and run.out is not None and run.out["code"] in (11, 102), run.why()
        assert "internal error" not in run.out["msg"], run.out["msg"]
        assert_no_traceback(run)
        assert run.elapsed < 15
        assert pod_link(ns) is None
    finally:
        fake.close()
        shutil.rmtree(sock_dir, ignore_errors=True)


STRICT_FIELDS = [
    # (id, env changes, conf changes, code, field named in the message)
    ("containerid-newline", {"CNI_CONTAINERID": "c" * 64 + "\n"}, {}, 4, "CNI_CONTAINERID"),
    ("ifname-newline", {"CNI_IFNAME": "net1\n"}, {}, 4, "CNI_IFNAME"),
    ("ifname-16-bytes", {"CNI_IFNAME": "é" * 8}, {}, 4, "CNI_IFNAME"),
    ("ifname-15-chars-30-bytes", {"CNI_IFNAME": "é" * 15}, {}, 4, "CNI_IFNAME"),
    ("cni-args-mac-newline", {"CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns1;K8S_POD_NAME=pod1;"
                                          "MAC=02:00:00:00:00:01\n"}, {}, 4, "MAC"),
    ("name-newline", {}, {"name": "testnet\n", "ipam": None}, 7, "name"),
    ("mac-newline", {}, {"mac": "02:00:00:00:00:01\n"}, 7, "mac"),
    ("runtime-mac-newline", {}, {"runtimeConfig": {"mac": "02:00:00:00:00:01\n"}}, 7, "runtimeConfig.mac"),
    ("bridge-newline", {}, {"bridge": "br-lab\n"}, 7, "bridge"),
    ("ipam-type-newline", {}, {"ipam": {"type": "host-local\n"}}, 7, "ipam.type"),
    ("dns-servers-string", {}, {"runtimeConfig": {"dns": {"servers": "x"}}}, 7, "dns"),
    ("dns-servers-number", {}, {"runtimeConfig": {"dns": {"servers": [5]}}}, 7, "dns"),
    ("dns-servers-not-ip", {}, {"runtimeConfig": {"dns": {"servers": ["not-an-ip"]}}}, 7, "dns"),
    ("dns-searches-string", {}, {"runtimeConfig": {"dns": {"servers": ["192.0.2.53"], "searches": "x"}}}, 7, "dns"),
    ("runtime-ips-string", {}, {"runtimeConfig": {"ips": "10.77.0.5/24"}}, 7, "ips"),
    ("args-cni-ips-string", {}, {"args": {"cni": {"ips": "10.77.0.5/24"}}}, 7, "ips"),
    ("trunk-id-and-range", {}, {"vlan": None, "trunk": [{"id": 10, "minID": 20, "maxID": 30}]}, 7, "trunk[0]"),
    ("trunk-id-and-min", {}, {"vlan": None, "trunk": [{"id": 10, "minID": 20}]}, 7, "trunk[0]"),
]


@pytest.mark.parametrize("env_change,conf_change,code,text", [c[1:] for c in STRICT_FIELDS],
                         ids=[c[0] for c in STRICT_FIELDS])
def test_9_validators_match_whole_strings_and_types(lab, plugin, netns_factory, no_leftovers, guard, env_change,
                                                   conf_change, code, text):
    ns = netns_factory()
    conf = plugin.conf()
    for key, value in conf_change.items():
        if key == "ipam" and value is not None:
            conf["ipam"] = {**conf["ipam"], **value}
        elif value is None:
            conf.pop(key, None)
        else:
            conf[key] = value
    run = invoke(plugin, "ADD", conf, new_cid(), ns.path, **env_change)
    assert_refused(run, code, text)
    assert pod_link(ns) is None and pod_link(ns, "net1\n") is None


def test_9_ordinary_errors_are_one_line_on_stderr_without_traceback(lab, plugin, netns_factory, tmp_path):
    # code 11: the node's OVSDB is down
    dead = write_node(tmp_path / "dead.yaml", lab, ovsdb=f"unix:{tmp_path}/dead.sock",
                      stateDir=str(tmp_path / "state"))
    ns = netns_factory()
    cid = new_cid()
    runner = PluginRunner(lab, extra_env={"TENANTNET_CONFIG": str(dead)})
    try:
        run = invoke(runner, "ADD", runner.conf(name="down", ipam=None), cid, ns.path)
        assert run.code == 1 and run.out is not None and run.out["code"] == 11, run.why()
        assert_no_traceback(run)
        assert len([line for line in run.stderr.splitlines() if line.strip()]) <= 1, run.stderr
    finally:
        host = host_ifname(cid, "net1")
        if host_link_exists(host):  # our own veth, should a failed rollback leave it
            subprocess.run(["ip", "link", "delete", host], capture_output=True, check=False)
    # code 101: the kernel refuses the pod's route (its gateway is on no connected network)
    cid = new_cid()
    conf = plugin.conf(name="noroute", ipam={"type": "host-local", "ranges": [[{"subnet": "10.82.0.0/24"}]],
                                             "routes": [{"dst": "10.200.0.0/16", "gw": "192.0.2.1"}],
                                             "dataDir": str(lab.hostlocal_dir)})
    try:
        run = invoke(plugin, "ADD", conf, cid, ns.path)
        assert run.code == 1 and run.out is not None and run.out["code"] == 101, run.why()
        assert_no_traceback(run)
        assert len([line for line in run.stderr.splitlines() if line.strip()]) <= 1, run.stderr
        assert plugin.call("DEL", conf, cid, ns.path).code == 0
        assert allocations_of(lab, cid) == [] and not host_link_exists(host_ifname(cid, "net1"))
    finally:
        scrub(lab, cid)


# ==== 10. STATUS on SR-IOV nodes ============================================================

def test_10_status_of_an_sriov_network_does_not_need_ovsdb(nic_lab, vfp, tmp_path):
    node = write_node(tmp_path / "node.yaml", nic_lab, ovsdb=f"unix:{tmp_path}/dead.sock")
    vfp.extra_env["TENANTNET_CONFIG"] = str(node)
    vf = vfs(nic_lab)[0]
    env = vfp.env("STATUS", netns=None, cni_args="")
    for conf in (vfconf(nic_lab, vf["address"], cniVersion="1.1.0", mode="sriov"),
                 vfconf(nic_lab, vf["address"], cniVersion="1.1.0"),
                 vfconf(nic_lab, None, cniVersion="1.1.0", pf="lpf0")):
        run = run_plugin(env, json.dumps(conf))
        assert run.code == 0, run.why()
    # an OVS network on the same node still reports that its OVSDB is down
    ovs = {"cniVersion": "1.1.0", "name": "ovsnet", "type": "tenantnet", "bridge": nic_lab.bridge}
    run = run_plugin(env, json.dumps(ovs))
    assert run.code == 1 and run.out is not None and run.out["code"] == 50, run.why()


# ==== 11. modes =============================================================================

def test_11_state_directories_records_and_logs_are_private(lab, netns_factory, tmp_path):
    state = tmp_path / "state"
    logs = tmp_path / "log"
    logs.mkdir()
    ipam_dir = allowed_dir(lab, "ipamDataDirs") / f"modes-{tag()}"
    node = write_node(tmp_path / "node.yaml", lab, stateDir=str(state), logFile=str(logs / "tenantnet.log"))
    runner = PluginRunner(lab, extra_env={"TENANTNET_CONFIG": str(node)})
    ns = netns_factory()
    cid = new_cid()
    conf = runner.conf(name="modes", logFile=str(logs / "nad.log"),
                       ipam={"type": "tenantnet-ipam", "ranges": [[{"subnet": "10.83.0.0/24"}]],
                             "dataDir": str(ipam_dir)})
    old = os.umask(0o022)  # what a runtime usually has
    try:
        inv = runner.add(conf, ns, cid)
        assert inv.code == 0, inv.stdout
        modes = {}
        for path in [state, *state.rglob("*")]:
            modes[str(path.relative_to(tmp_path))] = stat.S_IMODE(os.lstat(path).st_mode)
        attachments = state / "attachments"
        assert modes["state/attachments"] == 0o700, modes
        assert modes["state/attachments/modes"] == 0o700, modes
        (record,) = [p for p in attachments.rglob("*.json")]
        assert modes[str(record.relative_to(tmp_path))] == 0o600, modes
        for name, mode in modes.items():
            is_dir = (tmp_path / name).is_dir()
            assert mode == 0o700 if is_dir else mode & 0o077 == 0, f"{name} has mode {mode:04o}"
        for store in ipam_dir.glob("ipam.db*"):
            assert stat.S_IMODE(os.lstat(store).st_mode) & 0o077 == 0, f"{store} is readable by others"
        nad_log = logs / "nad.log"
        assert nad_log.exists(), "the NAD's logFile was not used"
        for log in logs.iterdir():
            assert stat.S_IMODE(os.lstat(log).st_mode) & ~0o640 == 0, f"{log}: {os.lstat(log).st_mode:o}"
        assert runner.call("DEL", conf, cid, ns.path).code == 0
    finally:
        os.umask(old)
        for c, i, f in list(runner.cleanups):
            runner.call("DEL", c, i, "", f)
        shutil.rmtree(ipam_dir, ignore_errors=True)


# ==== 12. mode inference and runtimeConfig.deviceID =========================================

def test_12_sriov_cni_nad_with_the_vf_only_in_runtime_config(nic_lab, vfp, netns_factory):
    before = snapshot(nic_lab)
    vf = vfs(nic_lab)[3]
    ns = netns_factory()
    cid = new_cid()
    conf = {"cniVersion": "1.0.0", "name": "sriovcni", "type": "tenantnet", "vlan": 100, "spoofchk": "on",
            "runtimeConfig": {"deviceID": vf["address"]},
            "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.84.0.0/24"}]],
                     "dataDir": str(nic_lab.hostlocal_dir)}}
    inv = vfp.add(conf, ns, cid)
    assert inv.code == 0, inv.stdout
    assert not host_link_exists(vf["netdev"]) and pod_link(ns) is not None  # the VF itself, in the pod
    assert LabVfControl(str(nic_lab.root)).read("lpf0", vf["index"]).vlan == 100
    assert vfp.call("DEL", conf, cid, ns.path).code == 0
    assert snapshot(nic_lab) == before


def test_12_bridge_plus_runtime_config_device_id_is_ovs_offload(switchdev_lab, off, netns_factory):
    before = vf_snapshot(switchdev_lab)
    vf = nic(switchdev_lab)["vfs"][2]
    ns = netns_factory()
    cid = new_cid()
    conf = {"cniVersion": "1.1.0", "name": "offrt", "type": "tenantnet", "bridge": switchdev_lab.bridge,
            "vlan": 100, "runtimeConfig": {"deviceID": vf["address"]}}
    inv = off.add(conf, ns, cid)
    assert inv.code == 0, inv.stdout
    rep, pod = inv.out["interfaces"]
    assert rep["name"] == vf["representor"] and pod.get("pciID") == vf["address"], inv.out
    port = representor_port(switchdev_lab, vf["representor"])
    assert port is not None and port[0] == 100 and port[1]["tenantnet-container-id"] == cid
    assert not host_link_exists(vf["netdev"])
    assert off.call("DEL", conf, cid, ns.path).code == 0
    assert vf_snapshot(switchdev_lab) == before and switchdev_lab.owned_ports() == []


# ==== the agent under hostile load ==========================================================

@pytest.fixture
def run_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="tnt-ag-"))  # a unix socket path stays under 108 bytes
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def agents() -> Iterator[list[AgentProcess]]:
    started: list[AgentProcess] = []
    yield started
    for a in started:
        stop_agent(a)


def start_agent(node: Path, *args: str) -> AgentProcess:
    """The agent in a session of its own with bounded memory; stopped by its pid."""
    socket_path, _ = nodepath.agent_socket_of(str(node))
    log = node.parent / f"agent-{tag()[:6]}.err"
    with open(log, "wb") as err:
        proc = subprocess.Popen(["prlimit", f"--as={AGENT_MEMORY_LIMIT}", sys.executable, "-m", "tenantnet.entry.agentctl",
                                 "--node-config", str(node), "run", *args],
                                stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
    handle = AgentProcess(proc, socket_path, node, log)
    deadline = time.monotonic() + 20
    while True:
        try:
            handle.status()
            return handle
        except (shim.AgentUnavailable, shim.AgentFailed):
            if proc.poll() is not None or time.monotonic() > deadline:
                stop_agent(handle)
                raise AssertionError(f"agent did not come up: {log.read_text()}") from None
            time.sleep(0.05)


def stop_agent(a: AgentProcess) -> None:
    if a.proc.poll() is None:
        os.kill(a.proc.pid, signal.SIGTERM)
        try:
            a.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(a.proc.pid, signal.SIGKILL)
            a.proc.wait(timeout=10)
    _kill_group(a.proc.pid)  # anything the agent started and left behind


def test_agent_survives_64_hostile_requests_at_once(lab, netns_factory, run_dir, agents):
    node = write_node(run_dir / "node.yaml", lab, agentSocket=f"{run_dir}/sock/agent.sock")
    agents.append(agent := start_agent(node))
    ovs_d = allowed_dir(lab, "ovsConfigurationPaths")
    resolv_d = allowed_dir(lab, "resolvConfPaths")
    t = tag()
    fifo_conf, fifo_resolv = ovs_d / f"tn-{t}.fifo", resolv_d / f"tn-{t}.fifo"
    zero_link = ovs_d / f"tn-{t}.zero"
    os.mkfifo(fifo_conf)
    os.mkfifo(fifo_resolv)
    zero_link.symlink_to("/dev/zero")
    ns = netns_factory()
    base = {"cniVersion": "1.0.0", "name": "hostile", "type": "tenantnet", "bridge": lab.bridge, "vlan": 100}
    host_local = {"type": "host-local", "ranges": [[{"subnet": "10.85.0.0/24"}]], "dataDir": str(lab.hostlocal_dir)}
    own_ipam = {"type": "tenantnet-ipam", "ranges": [[{"subnet": "10.85.0.0/24"}]],
                "dataDir": str(allowed_dir(lab, "ipamDataDirs"))}

    def conf(**kw: Any) -> bytes:
        return json.dumps({**base, **kw}).encode()

    hostile: list[tuple[str, bytes, set[int]]] = [
        ("fifo configuration_path", conf(configuration_path=str(fifo_conf)), {7}),
        ("fifo resolvConf host-local", conf(ipam={**host_local, "resolvConf": str(fifo_resolv)}), {7}),
        ("fifo resolvConf tenantnet-ipam", conf(ipam={**own_ipam, "resolvConf": str(fifo_resolv)}), {7}),
        ("/dev/zero configuration_path", conf(configuration_path="/dev/zero"), {7}),
        ("/dev/zero resolvConf", conf(ipam={**host_local, "resolvConf": "/dev/zero"}), {7}),
        ("symlink to /dev/zero", conf(configuration_path=str(zero_link)), {7}),
        ("just under the stdin limit", conf(vlan=5000, pad="x" * ((1 << 20) - 4096)), {7}),
        ("over the stdin limit", conf(pad="x" * (3 << 19)), {6}),
        ("over the frame limit", conf(pad="x" * (5 << 20)), {6, 11}),
        ("100000 deep", _nested(100000), {6}),
        ("ipam.type tenantnet", conf(ipam={**host_local, "type": "tenantnet"}), {7}),
    ]
    requests = [(hostile[i % len(hostile)], new_cid(), f"h{i}") for i in range(64)]
    attached: list[tuple[bytes, str, str]] = []

    def one(item: tuple[tuple[str, bytes, set[int]], str, str]) -> tuple[str, set[int], int, Any, float]:
        (name, stdin, expected), cid, ifname = item
        env = shim_env(node, "ADD", CNI_CONTAINERID=cid, CNI_IFNAME=ifname, CNI_NETNS=ns.path,
                       TENANTNET_AGENT_TIMEOUT="20")
        # Bounded: should the agent die, the shim would run the request in-process.
        run = run_plugin(env, stdin, timeout=40, memory=SHIM_MEMORY_LIMIT)
        if run.code == 0:
            attached.append((stdin, cid, ifname))
        return name, expected, -1 if run.code is None else run.code, run.out or run.stdout, run.elapsed

    try:
        # warm: the agent and the lab answer a normal ADD as usual
        normal = {**base, "name": "normal", "ipam": host_local}
        warm = new_cid()
        code, out, _ = call(shim_env(node, "ADD", CNI_CONTAINERID=warm, CNI_IFNAME="net1", CNI_NETNS=ns.path),
                            normal)
        assert code == 0, out
        code, out, _ = call(shim_env(node, "DEL", CNI_CONTAINERID=warm, CNI_IFNAME="net1", CNI_NETNS=ns.path),
                            normal)
        assert code == 0, out
        with ThreadPoolExecutor(64) as pool:
            answers = list(pool.map(one, requests))
        wrong = []
        for name, expected, code, out, elapsed in answers:
            got = out.get("code") if isinstance(out, dict) else None
            busy = got == 11 and "busy" in str(out.get("msg", ""))
            # No clock: a request stuck on a FIFO would get the shim's 20 s time-out (code 11,
            # not "busy") or the 40 s kill (-1), both wrong here.
            if code != 1 or not (got in expected or busy):
                wrong.append((name, code, out if not isinstance(out, dict) else {**out, "msg": out.get("msg", "")[:200]},
                               round(elapsed, 2)))
        assert wrong == [], wrong
        assert agent.proc.poll() is None, "the agent died"
        # The agent still serves: answered within the shim's 10 s (else code 11), no clock of
        # the test's (2 s was within a loaded machine's exec time).
        code, out, _ = call(shim_env(node, "VERSION", TENANTNET_AGENT_TIMEOUT="10"), b"{}")
        assert code == 0, out
        cid = new_cid()
        code, out, _ = call(shim_env(node, "ADD", CNI_CONTAINERID=cid, CNI_IFNAME="net1", CNI_NETNS=ns.path,
                                     TENANTNET_AGENT_TIMEOUT="10"), normal)
        assert code == 0, out
        health = subprocess.run([CTL, "--node-config", str(node), "agent", "status"], capture_output=True,
                                text=True, timeout=30)
        assert health.returncode == 0, health.stdout + health.stderr
        report = agent.status()
        assert report["pid"] == agent.proc.pid and report["peakRssKb"] < 2_000_000, report
        code, out, _ = call(shim_env(node, "DEL", CNI_CONTAINERID=cid, CNI_IFNAME="net1", CNI_NETNS=ns.path),
                            normal)
        assert code == 0, out
        assert lab.owned_ports() == [] and allocations_of(lab, cid) == []
    finally:
        for fifo in (fifo_conf, fifo_resolv):
            unjam(fifo)
            fifo.unlink()
        zero_link.unlink()
        for stdin, cid, ifname in attached:  # a defect let it through: undo it
            env = shim_env(node, "DEL", CNI_CONTAINERID=cid, CNI_IFNAME=ifname, CNI_NETNS="")
            run_plugin(env, stdin, timeout=40, memory=SHIM_MEMORY_LIMIT)
        for _, cid, ifname in requests:
            scrub(lab, cid, ifname)


def test_agent_status_fails_while_a_worker_is_wedged(lab, netns_factory, run_dir, agents):
    node = write_node(run_dir / "node.yaml", lab, agentSocket=f"{run_dir}/sock/agent.sock")
    cni_dir = run_dir / "cni"
    gate = run_dir / "ipam-gate"  # the ADD's IPAM holds its worker until the test makes it
    install_slow_ipam(cni_dir, 0, "10.86.0.5/24", gate)
    agents.append(agent := start_agent(node, "--workers", "1"))
    ns = netns_factory()
    cid = new_cid()
    conf = {"cniVersion": "1.0.0", "name": "slow", "type": "tenantnet", "bridge": lab.bridge,
            "ipam": {"type": "slow-ipam"}}
    env = shim_env(node, "ADD", CNI_CONTAINERID=cid, CNI_IFNAME="net1", CNI_NETNS=ns.path,
                   CNI_PATH=f"{cni_dir}:{BIN}:{GO_PLUGINS}", TENANTNET_AGENT_TIMEOUT="120")
    status = [CTL, "--node-config", str(node), "agent", "status"]
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(call, env, conf)
        try:
            deadline = time.monotonic() + 10
            while agent.status()["inflight"] < 1:
                assert time.monotonic() < deadline and not pending.done(), "the ADD never reached the agent"
                time.sleep(0.05)
            # busy on it for longer than 0.5 s, by the agent's own count (what status compares)
            deadline = time.monotonic() + 10
            while agent.status()["oldestRunningS"] <= 0.5:
                assert time.monotonic() < deadline and not pending.done(), "the ADD left the worker"
                time.sleep(0.05)
            wedged = subprocess.run([*status, "--wedged-after", "0.5"], capture_output=True, text=True, timeout=30)
            patient = subprocess.run(status, capture_output=True, text=True, timeout=30)
            code, out, _ = call(shim_env(node, "VERSION", TENANTNET_AGENT_TIMEOUT="30"), b"{}")  # no worker needed
            # No clock: the ADD is held at the gate, so the VERSION was answered while the
            # only worker was busy with it.
            measured = not pending.done() and agent.status()["inflight"] >= 1
        finally:
            gate.touch()
            code_add, out_add, _ = pending.result(timeout=60)
    assert measured, "the slow ADD ended before the health checks: the test measured nothing"
    assert wedged.returncode != 0, wedged.stdout + wedged.stderr
    assert patient.returncode == 0, patient.stdout + patient.stderr
    assert code == 0, f"VERSION was not answered while the worker was busy: {out}"
    assert code_add == 0, out_add
    after = subprocess.run([*status, "--wedged-after", "0.5"], capture_output=True, text=True, timeout=30)
    assert after.returncode == 0, after.stdout + after.stderr
    code, out, _ = call({**env, "CNI_COMMAND": "DEL"}, conf)
    assert code == 0, out
    assert lab.owned_ports() == []
