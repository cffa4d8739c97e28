"""A SIGKILL at every named crash point of ADD, DEL and GC, in every mode, then the runtime's
recovery: the whole node state (tests/integration/nodestate.py) is back to its baseline.

**The steps come from the code.** Every `faults.step("<literal>")` call under tenantnet/, cni/,
hostfiles/ and ipam/ is found with `ast` (a non-literal argument fails the suite). Modes, by prefix:
`add.` `record.` `ipam.` `del.` `gc.` → every mode; `ovs.` → ovs; `sriov.` → sriov and
ovs-offload (both drivers build on drivers/vf.py); `offload.` → ovs-offload. A step in a
module-level driver function also reaches the modes of the driver modules that call it
(`add_owned_port` in drivers/ovsport.py is the representor's port transaction of
ovs-offload too). The one pair excluded: device-info steps in mode ovs (no device info
there; `test_unreachable_pairs_stay_unreachable` proves it). Verbs: `add.` `record.` → ADD,
`del.` → DEL and GC, `gc.` → GC, `ipam.` → all three; a driver step by where it is: under
`attach` (or a function attach calls) → ADD, under `detach` (or what detach calls) → DEL and
GC. `record.tmp-written` is reached once per record save, and ADD saves as many times as
`Plugin._add` calls `save` (two: intent, ready): both are killed (`record.tmp-written@2`).
`test_every_step_is_exercised` fails when a step is assigned to no test.

**What runs** (every plugin exec runs in-process: the node config names an agent socket
that nobody serves):

- `test_kill_add_then_recover` — for each mode and each ADD step: ADD killed there
  (returncode -9, empty stdout), one recovery, state == baseline. Recoveries: `DEL`;
  `DEL-no-netns` (CNI_NETNS=""); `netns-gone` (the pod netns deleted, then DEL naming it);
  `GC` (cniVersion 1.1.0, `cni.dev/valid-attachments: []`, in ovs-offload without deviceID as
  its NAD; applies in every mode: each has a record from before it touches anything); `re-ADD`
  (ADD again, then DEL). Every recovery for every step, in every mode.
  `test_steps_are_enumerated_from_the_code` prints the steps and the case counts (with this
  tree: 21 steps — ovs 14, sriov 15, ovs-offload 19 — and 180 in-process ADD kills: 11, 11
  and 14 kill points × 5 recoveries).
- `test_kill_add_through_agent_then_del` — every ADD step of every mode: an agent started
  with the fault in its environment, ADD through the shim (code 11 when the agent dies, the agent killed by SIGKILL), a clean
  agent started, DEL through it, the agent stopped, state == baseline.
- `test_kill_del_then_del_again` / `test_kill_gc_then_gc_again` — every DEL (GC) step of
  every mode: a completed ADD, then DEL (GC) killed there, then DEL (GC) again → baseline.
- `test_kill_undo_of_stale_record_then_del` — mode ovs: ADD killed at add.pod-configured,
  a re-ADD killed at each teardown step while it undoes that stale attempt, then DEL.
- `test_orphaned_ipam_child_allocation_is_released` — each mode: ADD killed while host-local
  runs; the orphaned child finishes alone (its allocation is seen), DEL releases it, no IPAM
  process is left.
- `test_random_instant_kills` — mode ovs with tenantnet-ipam (in-process SQLite): ADDs
  killed after a random delay in [0, T], T the fastest of 3 un-faulted ADDs measured from
  the exec to the first byte of the result, until 8 have landed before the ADD completed
  (the process had not exited and printed nothing), 30 trials at most; after each, landed
  or not, DEL → baseline.
- `test_a_snapshot_of_an_untouched_node_is_the_same_twice` — nodestate.snapshot has no noise
  of its own (its cost is printed).

Every case takes its own baseline just before its ADD, so a leak fails the case that made
it (a later case starts from the state it left). Netns, agents and attachments are removed
afterwards also when a case fails (DEL and GC of what it made).

The modes' labs share nothing, so the sweep's cases (the tests marked `@swept`) run in one
thread per mode, each mode's cases in pytest's order; each test waits for its case and
raises what it raised. The other tests run alone (see "the sweep, run ahead" below).
"""

from __future__ import annotations

import ast
import contextlib
import functools
import inspect
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import unicodedata
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tenantnet.lab.nic import LabNic
from tenantnet.plugin import faults
from tests.integration import nodestate
from tests.integration.conftest import BIN, GO_PLUGINS, PLUGIN, Invocation, Lab, Netns, netns_maker, new_cid
from tests.integration.test_agent import AgentProcess, agent_node_config, start_agent, wait_until

REPO = Path(__file__).resolve().parents[2]
SOURCE_ROOTS = ("tenantnet", "cni", "hostfiles", "ipam")
DRIVERS = REPO / "tenantnet" / "plugin" / "drivers"
MODES = ("ovs", "sriov", "ovs-offload")
LAB_FIXTURE = {"ovs": "lab", "sriov": "nic_lab", "ovs-offload": "switchdev_lab"}
ALL_MODES = frozenset(MODES)
PREFIX_MODES = {"add": ALL_MODES, "record": ALL_MODES, "ipam": ALL_MODES, "del": ALL_MODES,
                "gc": ALL_MODES, "ovs": frozenset({"ovs"}), "sriov": frozenset({"sriov", "ovs-offload"}),
                "offload": frozenset({"ovs-offload"})}
PREFIX_VERBS = {"add": {"ADD"}, "record": {"ADD"}, "del": {"DEL", "GC"}, "gc": {"GC"},
                "ipam": {"ADD", "DEL", "GC"}}
TEARDOWN = frozenset({"DEL", "GC"})
# Steps of the DRA driver (tenantnet/kube/dra.py) are reached by prepare/attach/unprepare, not
# by a CNI call: `dra_steps()` lists them for tests/integration/test_dra.py's sweep.
DRA_PREFIX = "dra"
# Steps of an overlay attachment (tenantnet/plugin/drivers/ovnport.py) are reached only on an
# overlay network, i.e. with OVN: `overlay_steps()` lists them for
# tests/integration/test_overlay_faults.py's sweep on the OVN lab.
OVN_PREFIX = "ovn"
RECOVERIES = ("DEL", "DEL-no-netns", "netns-gone", "GC", "re-ADD")
FULL_RECOVERY_MODES = ("ovs", "sriov", "ovs-offload")  # every recovery after every ADD step
KILLED = -signal.SIGKILL


# ---- the steps, from the code -----------------------------------------------------------------

@dataclass
class Step:
    name: str
    sites: list[str] = field(default_factory=list)  # file:line (function)
    modes: set[str] = field(default_factory=set)
    verbs: set[str] = field(default_factory=set)
    add_occurrences: int = 1  # times one ADD reaches it


@dataclass
class _Site:
    name: str
    path: Path
    line: int
    scope: list[tuple[str, str]]  # ("class" | "def", name), outermost first


class _StepFinder(ast.NodeVisitor):
    def __init__(self, path: Path, bare_step: bool) -> None:
        self.path, self.bare = path, bare_step
        self.scope: list[tuple[str, str]] = []
        self.sites: list[_Site] = []
        self.problems: list[str] = []

    def _scoped(self, kind: str, node: Any) -> None:
        self.scope.append((kind, node.name))
        self.generic_visit(node)
        self.scope.pop()

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._scoped("class", node)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._scoped("def", node)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self._scoped("def", node)

    def visit_Call(self, node: ast.Call) -> None:
        f = node.func
        if (isinstance(f, ast.Attribute) and f.attr == "step" and isinstance(f.value, ast.Name)
                and f.value.id == "faults") or (self.bare and isinstance(f, ast.Name) and f.id == "step"):
            arg = node.args[0] if len(node.args) == 1 and not node.keywords else None
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                self.sites.append(_Site(arg.value, self.path, node.lineno, list(self.scope)))
            else:
                self.problems.append(f"{self.path.relative_to(REPO)}:{node.lineno}: {ast.unparse(node)} "
                                     "— a crash point must be named by a string literal")
        self.generic_visit(node)


@functools.cache
def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), str(path))


def _may_call_step(path: Path) -> bool:
    """False only when the file cannot call `step`: the name appears nowhere in its text once
    normalised as Python normalises identifiers (NFKC). Spares parsing and walking the ≈ 140
    files that have no crash point (the walk was most of this module's import time)."""
    return "step" in unicodedata.normalize("NFKC", path.read_text(encoding="utf-8"))


def _called_names(node: ast.AST) -> set[str]:
    out = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Call):
            if isinstance(n.func, ast.Name):
                out.add(n.func.id)
            elif isinstance(n.func, ast.Attribute):
                out.add(n.func.attr)
    return out


def _driver_facts() -> tuple[dict[Path, set[str]], dict[str, set[Path]], set[str], set[str]]:
    """(modes per driver module (its classes' `mode = "…"`), modules calling each name,
    names called under some driver's attach, names called under some detach)."""
    modes: dict[Path, set[str]] = {}
    callers: dict[str, set[Path]] = {}
    under_attach: set[str] = set()
    under_detach: set[str] = set()
    for path in sorted(DRIVERS.glob("*.py")):
        tree = _parse(path)
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
            for stmt in cls.body:
                if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "mode"
                                                        for t in stmt.targets) \
                        and isinstance(stmt.value, ast.Constant):
                    modes.setdefault(path, set()).add(stmt.value.value)
                if isinstance(stmt, ast.FunctionDef) and stmt.name in ("attach", "detach"):
                    (under_attach if stmt.name == "attach" else under_detach).update(_called_names(stmt))
        for name in _called_names(tree):
            callers.setdefault(name, set()).add(path)
    return modes, callers, under_attach, under_detach


def _saves_per_add() -> int:
    tree = _parse(REPO / "tenantnet" / "plugin" / "core.py")
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Plugin"):
        for fn in (n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "_add"):
            return sum(1 for n in ast.walk(fn) if isinstance(n, ast.Call)
                       and isinstance(n.func, ast.Attribute) and n.func.attr == "save")
    raise AssertionError("tenantnet/plugin/core.py has no Plugin._add: teach test_faults.py how ADD saves records")


@functools.cache
def _sites_and_problems() -> tuple[tuple[_Site, ...], tuple[str, ...]]:
    sites: list[_Site] = []
    problems: list[str] = []
    for root in SOURCE_ROOTS:
        for path in sorted((REPO / root).rglob("*.py")):
            if not _may_call_step(path):
                continue
            tree = _parse(path)
            bare = any(isinstance(n, ast.ImportFrom) and n.module == "tenantnet.plugin.faults"
                       and any(a.name == "step" for a in n.names) for n in ast.walk(tree))
            finder = _StepFinder(path, bare)
            finder.visit(tree)
            sites += finder.sites
            problems += finder.problems
    return tuple(sites), tuple(problems)


def _all_sites() -> tuple[list[_Site], list[str]]:
    """Every `faults.step(...)` call in the source, and the problems found reading them (read
    once per process: this module's import, dra_steps() and overlay_steps() share it)."""
    sites, problems = _sites_and_problems()
    return list(sites), list(problems)


def dra_steps() -> list[str]:
    """Every `faults.step("dra.…")` in the source, in the order of the source."""
    return list(dict.fromkeys(s.name for s in _all_sites()[0] if s.name.partition(".")[0] == DRA_PREFIX))


def overlay_steps() -> list[str]:
    """Every `faults.step("ovn.…")` in the source, in the order of the source."""
    return list(dict.fromkeys(s.name for s in _all_sites()[0] if s.name.partition(".")[0] == OVN_PREFIX))


def enumerate_steps() -> tuple[dict[str, Step], list[str], dict[Path, set[str]]]:
    """Every crash point in the source, with the modes and verbs that reach it; problems."""
    sites, problems = _all_sites()
    driver_modes, callers, under_attach, under_detach = _driver_facts()
    saves = _saves_per_add()
    steps: dict[str, Step] = {}
    for site in sites:
        if site.name.partition(".")[0] == DRA_PREFIX:
            continue  # the DRA driver's own steps: tests/integration/test_dra.py kills the agent at each
        if site.name.partition(".")[0] == OVN_PREFIX:
            continue  # an overlay's steps: tests/integration/test_overlay_faults.py kills the plugin at each
        step = steps.setdefault(site.name, Step(site.name))
        where = f"{site.path.relative_to(REPO)}:{site.line} ({'.'.join(n for _, n in site.scope)})"
        step.sites.append(where)
        prefix = site.name.partition(".")[0]
        if prefix not in PREFIX_MODES:
            problems.append(f"{where}: step {site.name!r} has a prefix test_faults.py does not know "
                            f"({', '.join(sorted(PREFIX_MODES))}): say which modes reach it")
            continue
        step.modes |= PREFIX_MODES[prefix]
        function = site.scope[-1][1] if site.scope and site.scope[-1][0] == "def" else ""
        module_level = len(site.scope) == 1 and site.scope[0][0] == "def"
        if module_level and site.path.parent == DRIVERS:
            for caller in callers.get(function, set()):
                step.modes |= driver_modes.get(caller, set())
        if prefix in PREFIX_VERBS:
            step.verbs |= PREFIX_VERBS[prefix]
        else:
            in_class = any(kind == "class" for kind, _ in site.scope)
            if (in_class and function == "attach") or (module_level and function in under_attach):
                step.verbs.add("ADD")
            if (in_class and function == "detach") or (module_level and function in under_detach):
                step.verbs |= TEARDOWN
            if not step.verbs:
                problems.append(f"{where}: cannot tell which verb reaches driver step {site.name!r} "
                                "(not under attach or detach): teach test_faults.py")
        if [n for k, n in site.scope] == ["RecordStore", "save"]:
            step.add_occurrences = saves
    return steps, problems, driver_modes


STEPS, STEP_PROBLEMS, DRIVER_MODES = enumerate_steps()


def reachable(step: str, mode: str) -> bool:
    """Mode ovs writes no device-info file (tenantnet/plugin/tnconf.py: device_info_file is None
    there), so its device-info steps cannot be reached; proven by a test below."""
    return not (mode == "ovs" and "devinfo" in step)


def steps_for(mode: str, verb: str) -> list[Step]:
    return [s for s in STEPS.values() if mode in s.modes and verb in s.verbs and reachable(s.name, mode)]


def _faults_of(step: Step) -> list[str]:
    return [step.name] + [f"{step.name}@{n}" for n in range(2, step.add_occurrences + 1)]


def _add_cases() -> list[tuple[str, str, str]]:
    cases = []
    for mode in MODES:
        for i, fault in enumerate(f for s in steps_for(mode, "ADD") for f in _faults_of(s)):
            if mode in FULL_RECOVERY_MODES:
                chosen = list(RECOVERIES)
            else:
                chosen = ["DEL"] + ([RECOVERIES[i % len(RECOVERIES)]] if i % len(RECOVERIES) else [])
            cases += [(mode, fault, how) for how in chosen]
    return cases


def _agent_cases() -> list[tuple[str, str]]:
    """Every ADD step of every mode, killed in the agent."""
    return [(mode, fault) for mode in MODES for step in steps_for(mode, "ADD") for fault in _faults_of(step)]


ADD_CASES = _add_cases()
AGENT_CASES = _agent_cases()
DEL_CASES = [(mode, s.name) for mode in MODES for s in steps_for(mode, "DEL")]
GC_CASES = [(mode, s.name) for mode in MODES for s in steps_for(mode, "GC")]
UNDO_CASES = [s.name for s in steps_for("ovs", "DEL")]
UNREACHABLE = [(mode, s.name) for s in STEPS.values() for mode in sorted(s.modes) if not reachable(s.name, mode)]
CONFIRMED: set[tuple[str, str]] = set()  # (mode, step) where a process was seen killed
RAN: set[str] = set()


def _ids(cases: list[tuple[str, ...]]) -> list[str]:
    return ["-".join(c) for c in cases]


# ---- the nodes: one per mode, on the conftest labs ----------------------------------------------

@dataclass
class Node:
    mode: str
    lab: Lab
    node_config: Path  # the lab's, with an agent socket nobody serves: every exec in-process
    network: str
    vf: dict[str, Any] | None = None

    def conf(self, cid: str, **kw: Any) -> dict[str, Any]:
        lab = self.lab
        hostlocal = {"type": "host-local", "dataDir": str(lab.hostlocal_dir)}
        if self.mode == "ovs":
            base: dict[str, Any] = {"cniVersion": "1.0.0", "bridge": lab.bridge, "vlan": 100, "mtu": 1400,
                                    "ipam": {**hostlocal, "ranges": [[{"subnet": "10.181.0.0/24"}]]}}
        else:
            assert self.vf is not None
            # The name Multus gives this attachment's file (the only one tenantnet writes).
            devinfo_dir = (yaml.safe_load(lab.node_config.read_text()) or {}).get("deviceInfoDir")
            devinfo = f"{devinfo_dir or lab.root / 'devinfo'}/faults-{self.network}-{cid}_net1"
            base = {"deviceID": self.vf["address"], "mac": "02:18:00:00:00:01", "mtu": 1400,
                    "runtimeConfig": {"CNIDeviceInfoFile": devinfo}}
            if self.mode == "sriov":
                base.update({"cniVersion": "1.0.0", "vlan": 300, "vlanQoS": 3, "trust": "on",
                             "link_state": "enable", "min_tx_rate": 100, "max_tx_rate": 1000,
                             "ipam": {**hostlocal, "ranges": [[{"subnet": "10.182.0.0/24"}]]}})
            else:
                base.update({"cniVersion": "1.0.0", "mode": "ovs-offload", "vlan": 100,
                             "ipam": {**hostlocal, "ranges": [[{"subnet": "10.183.0.0/24"}]]}})
        base.update({"name": self.network, "type": "tenantnet"})
        base.update(kw)
        return {k: v for k, v in base.items() if v is not None}

    def gc_conf(self, conf: dict[str, Any]) -> dict[str, Any]:
        gc = {**conf, "cniVersion": "1.1.0", "cni.dev/valid-attachments": []}
        if self.mode == "ovs-offload":
            gc.pop("deviceID")  # as its NAD: the device plugin hands out a VF per pod
        return gc

    def env(self, command: str, cid: str = "", netns: str | None = "", fault: str | None = None,
            node_config: Path | None = None) -> dict[str, str]:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "CNI_COMMAND": command,
               "CNI_PATH": f"{BIN}:{GO_PLUGINS}", "TENANTNET_CONFIG": str(node_config or self.node_config)}
        if cid:
            env.update({"CNI_CONTAINERID": cid, "CNI_IFNAME": "net1",
                        "CNI_ARGS": f"IgnoreUnknown=1;K8S_POD_NAMESPACE=faults;K8S_POD_NAME=pod-{cid[:8]}"})
        if netns is not None:
            env["CNI_NETNS"] = netns
        if fault:
            env[faults.FAULT_ENV] = fault
        return env

    def run(self, env: dict[str, str], conf: dict[str, Any], timeout: float = 60) -> Invocation:
        proc = subprocess.run([PLUGIN], input=json.dumps(conf).encode(), env=env, capture_output=True,
                              timeout=timeout, check=False)
        stdout = proc.stdout.decode(errors="replace")
        try:
            out = json.loads(stdout) if stdout.strip() else None
        except ValueError:
            out = None
        return Invocation(proc.returncode, out, stdout, proc.stderr.decode(errors="replace"))

    def call(self, command: str, conf: dict[str, Any], cid: str, netns: str, fault: str | None = None,
             node_config: Path | None = None) -> Invocation:
        return self.run(self.env(command, cid, netns, fault, node_config), conf)

    def gc(self, conf: dict[str, Any], fault: str | None = None) -> Invocation:
        return self.run(self.env("GC", netns=None, fault=fault), self.gc_conf(conf))


@pytest.fixture(scope="session")
def fault_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="tnf-"))  # short: agent sockets live below it
    yield path
    shutil.rmtree(path, ignore_errors=True)


_NODES: dict[str, Node] = {}


def node_for(request: pytest.FixtureRequest, mode: str, fault_dir: Path) -> Node:
    lab: Lab = request.getfixturevalue(LAB_FIXTURE[mode])
    if mode not in _NODES or _NODES[mode].lab is not lab:
        config = fault_dir / f"{mode}.yaml"
        config.write_text(lab.node_config.read_text() + f"agentSocket: {fault_dir}/nobody-{mode}.sock\n")
        (lab.root / "devinfo").mkdir(exist_ok=True)
        vf = None
        if mode != "ovs":
            usable = [v for v in LabNic(str(lab.root)).describe()[0]["vfs"] if v["netdev"]]
            vf = usable[-1]  # the other tests of the session start with the first ones
        _NODES[mode] = Node(mode, lab, config, {"ovs": "fltovs", "sriov": "fltvf", "ovs-offload": "fltoff"}[mode],
                            vf)
    return _NODES[mode]


@dataclass
class Pod:
    node: Node
    ns: Netns
    cid: str
    conf: dict[str, Any]


class PodFactory:
    """pods(mode) → a fresh pod: a netns with lo up (as the runtime leaves it) and a
    container id. Afterwards — unless the test called done() — DEL and GC of its pods."""

    def __init__(self, node_of: Callable[[str], Node], make_netns: Callable[[], Netns]) -> None:
        self.node_of, self.make_netns = node_of, make_netns
        self.made: list[Pod] = []
        self.clean = False

    def __call__(self, mode: str, **conf_kw: Any) -> Pod:
        node = self.node_of(mode)
        ns = self.make_netns()
        subprocess.run(["ip", "-n", ns.name, "link", "set", "lo", "up"], check=True, capture_output=True)
        cid = new_cid()
        pod = Pod(node, ns, cid, node.conf(cid, **conf_kw))
        self.made.append(pod)
        return pod

    def done(self) -> None:
        self.clean = True

    def cleanup(self) -> None:
        if self.clean:
            return
        for pod in self.made:
            pod.node.call("DEL", pod.conf, pod.cid, "")
            pod.node.gc(pod.conf)


@pytest.fixture
def pods(netns_factory: Any, fault_dir: Path, request: pytest.FixtureRequest) -> Iterator[PodFactory]:
    factory = PodFactory(lambda mode: node_for(request, mode, fault_dir), netns_factory)
    yield factory
    factory.cleanup()  # before netns_factory deletes the namespaces


# ---- the sweep, run ahead: one thread per lab ------------------------------------------------------
#
# The three modes live on three labs that share nothing (own OVSDB and userspace datapath, own
# simulated NIC, state, IPAM and devinfo directories; nodestate.snapshot of one lab leaves out
# every other lab's links and processes, as it must for other runs sharing the machine). A
# case's time is almost all plugin and agent start-ups, one at a time: one core busy of two. So
# the cases of the tests marked @swept run ahead of pytest, in one thread per mode, each mode's
# cases one after the other in pytest's order — within a lab nothing changes: each case takes
# its baseline just before its ADD and starts from the state the previous case left. Each
# test then waits for its own case and raises what the case raised (the same assertions, run
# in the worker). A case's cleanup (DEL and GC of its pods unless done(), its namespaces and
# agent directory) runs in the worker too, right after it. The other tests of this module
# wait until no case runs ahead (`_nothing_runs_ahead`).

SWEPT: dict[str, tuple[Callable[..., None], str | None]] = {}  # test name → (case, its mode if fixed)
WORKER_FIXTURES = ("pods", "agent_dir")  # what a swept case may take besides its parameters


def swept(mode: str | None = None) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Make a case (taking `pods`, maybe `agent_dir`, and its parameters) a test whose body
    runs ahead (above); `mode`: the lab of a case without a `mode` parameter."""
    def wrap(case: Callable[..., None]) -> Callable[..., None]:
        SWEPT[case.__name__] = (case, mode)
        names = [n for n in inspect.signature(case).parameters if n not in WORKER_FIXTURES]

        def test(ahead: Ahead, request: pytest.FixtureRequest, **_params: Any) -> None:
            ahead.outcome(request.node)

        kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
        test.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            [inspect.Parameter(n, kind) for n in ("ahead", "request", *names)])
        test.__name__ = test.__qualname__ = case.__name__
        test.__doc__ = case.__doc__
        return test
    return wrap


@contextlib.contextmanager
def _temp_dir(prefix: str) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


class Ahead:
    """The selected items of the swept tests, run in one thread per mode (see above)."""

    def __init__(self, nodes: dict[str, Node], items: list[pytest.Function]) -> None:
        self.nodes = nodes
        self.finished = {item.nodeid: threading.Event() for item in items}
        self.raised: dict[str, BaseException] = {}
        self.stopping = threading.Event()
        queues: dict[str, list[pytest.Function]] = {}
        for item in items:
            queues.setdefault(self.mode_of(item), []).append(item)
        self.threads = [threading.Thread(target=self._work, args=(queue,), name=f"faults-{mode}")
                        for mode, queue in queues.items()]
        for t in self.threads:
            t.start()

    @staticmethod
    def mode_of(item: pytest.Function) -> str:
        _, fixed = SWEPT[item.originalname]
        return fixed or item.callspec.params["mode"]

    def _work(self, queue: list[pytest.Function]) -> None:
        for item in queue:
            try:
                if self.stopping.is_set():
                    raise RuntimeError("not run: the sweep was stopped (the session is ending)")
                self._run(item)
            except BaseException as exc:  # noqa: B036 — handed to the test, which raises it
                self.raised[item.nodeid] = exc
            finally:
                self.finished[item.nodeid].set()

    def _run(self, item: pytest.Function) -> None:
        case, _ = SWEPT[item.originalname]
        kw = dict(item.callspec.params)
        with contextlib.ExitStack() as stack:
            factory = PodFactory(self.nodes.__getitem__, stack.enter_context(netns_maker()))
            if "agent_dir" in inspect.signature(case).parameters:
                kw["agent_dir"] = stack.enter_context(_temp_dir("tnfa-"))
            try:
                case(factory, **kw)
            finally:
                factory.cleanup()  # before its namespaces go (the stack's exit)

    def outcome(self, item: pytest.Item) -> None:
        """Wait for the item's case; raise what it raised."""
        self.finished[item.nodeid].wait()
        if item.nodeid in self.raised:
            raise self.raised[item.nodeid]

    def drain(self) -> None:
        for t in self.threads:
            t.join()


_AHEAD: list[Ahead] = []


@pytest.fixture(scope="module")
def ahead(request: pytest.FixtureRequest, fault_dir: Path) -> Iterator[Ahead]:
    module = sys.modules[__name__]
    items = [i for i in request.session.items if isinstance(i, pytest.Function)
             and i.module is module and i.originalname in SWEPT]
    # The labs are fixtures: brought up here, in pytest's thread, before any worker starts.
    nodes = {mode: node_for(request, mode, fault_dir) for mode in sorted({Ahead.mode_of(i) for i in items})}
    runner = Ahead(nodes, items)
    _AHEAD.append(runner)
    try:
        yield runner
    finally:
        runner.stopping.set()
        runner.drain()
        _AHEAD.remove(runner)


@pytest.fixture(autouse=True)
def _nothing_runs_ahead(request: pytest.FixtureRequest) -> None:
    """A test of this module that is not swept runs alone: after every case run ahead."""
    if getattr(request.node, "originalname", "") not in SWEPT:
        for runner in _AHEAD:
            runner.drain()


def assert_killed(inv: Invocation, mode: str, fault: str, what: str) -> None:
    assert inv.code == KILLED and inv.stdout == "", (
        f"{what} with {faults.FAULT_ENV}={fault} was not killed there (mode {mode}): "
        f"code {inv.code}, stdout {inv.stdout!r}, stderr {inv.stderr[-1500:]!r}")
    CONFIRMED.add((mode, fault.partition("@")[0]))


def assert_ok(inv: Invocation, what: str) -> None:
    assert inv.code == 0, f"{what} failed: code {inv.code}, stdout {inv.stdout!r}, stderr {inv.stderr[-1500:]!r}"


def assert_baseline(pod: Pod, before: dict[str, Any], what: str, ns_gone: bool = False) -> None:
    if ns_gone:
        now = nodestate.snapshot(pod.node.lab)
        before = nodestate.without_netns(before)
    else:
        now = nodestate.snapshot(pod.node.lab, [pod.ns])
    delta = nodestate.diff(before, now)
    assert delta == "", f"LEAK — mode {pod.node.mode}, {what}; node state differs from the baseline:\n{delta}"


def recover(pod: Pod, how: str) -> bool:
    """Run one recovery; True if the pod netns is gone afterwards."""
    node, conf, cid, ns = pod.node, pod.conf, pod.cid, pod.ns
    if how == "DEL":
        assert_ok(node.call("DEL", conf, cid, ns.path), "DEL")
    elif how == "DEL-no-netns":
        assert_ok(node.call("DEL", conf, cid, ""), "DEL with CNI_NETNS=''")
    elif how == "netns-gone":
        ns.delete()
        assert_ok(node.call("DEL", conf, cid, ns.path), "DEL after the netns was deleted")
        return True
    elif how == "GC":
        assert_ok(node.gc(conf), "GC")
    elif how == "re-ADD":
        assert_ok(node.call("ADD", conf, cid, ns.path), "the re-ADD")
        assert_ok(node.call("DEL", conf, cid, ns.path), "DEL after the re-ADD")
    else:
        raise AssertionError(how)
    return False


# ---- the steps themselves ----------------------------------------------------------------------

def test_steps_are_enumerated_from_the_code():
    assert STEP_PROBLEMS == [], "\n".join(STEP_PROBLEMS)
    assert set().union(*DRIVER_MODES.values()) == set(MODES), \
        f"driver modes {DRIVER_MODES} differ from the modes this suite has labs for {MODES}"
    assert len(STEPS) >= 10, sorted(STEPS)
    for step in STEPS.values():
        assert step.modes and step.verbs, step
    lines = [f"{len(STEPS)} crash points enumerated from the code:"]
    for step in sorted(STEPS.values(), key=lambda s: s.name):
        occurrences = f" ×{step.add_occurrences} per ADD" if step.add_occurrences > 1 else ""
        lines.append(f"  {step.name:24} {'/'.join(sorted(step.verbs)):11} {','.join(sorted(step.modes)):24}"
                     f"{occurrences}  {'; '.join(step.sites)}")
    for mode in MODES:
        per = {verb: len(steps_for(mode, verb)) for verb in ("ADD", "DEL", "GC")}
        total = len({s.name for verb in per for s in steps_for(mode, verb)})
        lines.append(f"  mode {mode}: {total} steps (ADD {per['ADD']}, DEL {per['DEL']}, GC {per['GC']})")
    lines.append(f"  cases: ADD kills {len(ADD_CASES)}, agent {len(AGENT_CASES)}, DEL {len(DEL_CASES)}, "
                 f"GC {len(GC_CASES)}, stale-undo {len(UNDO_CASES)}")
    print("\n".join(lines))


def test_every_step_is_exercised():
    """Each enumerated step, in each mode that reaches it, is killed by some test below."""
    covered = {(m, f.partition("@")[0]) for m, f, _ in ADD_CASES} | set(DEL_CASES) | set(GC_CASES)
    wanted = {(m, s.name) for s in STEPS.values() for m in s.modes if reachable(s.name, m)}
    assert wanted - covered == set(), f"steps no test kills: {sorted(wanted - covered)}"
    assert {s.name for s in STEPS.values()} <= {n for _, n in covered}
    for step in STEPS.values():
        if "ADD" in step.verbs and step.add_occurrences > 1:
            assert any(f == f"{step.name}@{step.add_occurrences}" for _, f, _ in ADD_CASES), step


@pytest.mark.parametrize("mode,step", UNREACHABLE, ids=_ids(UNREACHABLE))
@swept()
def test_unreachable_pairs_stay_unreachable(pods, mode, step):
    """The pairs left out of the sweep: an ADD and a DEL with the fault set run through."""
    pod = pods(mode)
    before = nodestate.snapshot(pod.node.lab, [pod.ns])
    assert_ok(pod.node.call("ADD", pod.conf, pod.cid, pod.ns.path, fault=step), f"ADD with {step} set")
    assert_ok(pod.node.call("DEL", pod.conf, pod.cid, pod.ns.path, fault=step), f"DEL with {step} set")
    assert_baseline(pod, before, f"ADD+DEL with unreachable {step}")
    pods.done()


# ---- ADD killed at each step, then each recovery --------------------------------------------------

@pytest.mark.parametrize("mode,fault,how", ADD_CASES, ids=_ids(ADD_CASES))
@swept()
def test_kill_add_then_recover(pods, mode, fault, how):
    pod = pods(mode)
    before = nodestate.snapshot(pod.node.lab, [pod.ns])
    assert_killed(pod.node.call("ADD", pod.conf, pod.cid, pod.ns.path, fault=fault), mode, fault, "ADD")
    gone = recover(pod, how)
    assert_baseline(pod, before, f"ADD killed at {fault}, recovery {how}", ns_gone=gone)
    RAN.add(f"add:{mode}:{fault}:{how}")
    pods.done()


# ---- the same through the agent ------------------------------------------------------------------

@pytest.mark.parametrize("mode,fault", AGENT_CASES, ids=_ids(AGENT_CASES))
@swept()
def test_kill_add_through_agent_then_del(pods, agent_dir, mode, fault):
    pod = pods(mode)
    node = pod.node
    config = agent_node_config(node.lab, agent_dir)
    started: list[AgentProcess] = []
    try:
        before = nodestate.snapshot(node.lab, [pod.ns])
        started.append(faulty := start_agent(config, extra_env={faults.FAULT_ENV: fault}))
        inv = node.call("ADD", pod.conf, pod.cid, pod.ns.path, node_config=config)
        try:
            died = faulty.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            died = None
        assert died == KILLED, f"the agent was not killed at {fault} (mode {mode}): it is {died}; " \
                               f"the shim said {inv.code} {inv.stdout!r}"
        CONFIRMED.add((mode, fault.partition("@")[0]))
        assert inv.code == 1 and inv.out and inv.out["code"] == 11, \
            f"the shim did not answer 'try again later' when the agent died: {inv.code} {inv.stdout!r}"
        started.append(clean := start_agent(config))
        assert_ok(node.call("DEL", pod.conf, pod.cid, pod.ns.path, node_config=config), "DEL through the agent")
        assert clean.served() >= 1  # the DEL really went through the agent
        clean.stop()
        assert_baseline(pod, before, f"agent killed at {fault} during ADD, DEL through a new agent")
    finally:
        for a in started:
            a.stop()
    pods.done()


# ---- the recovery itself killed ---------------------------------------------------------------------

@pytest.mark.parametrize("mode,step", DEL_CASES, ids=_ids(DEL_CASES))
@swept()
def test_kill_del_then_del_again(pods, mode, step):
    pod = pods(mode)
    node = pod.node
    before = nodestate.snapshot(node.lab, [pod.ns])
    assert_ok(node.call("ADD", pod.conf, pod.cid, pod.ns.path), "ADD")
    assert_killed(node.call("DEL", pod.conf, pod.cid, pod.ns.path, fault=step), mode, step, "DEL")
    assert_ok(node.call("DEL", pod.conf, pod.cid, pod.ns.path), "the second DEL")
    assert_baseline(pod, before, f"DEL killed at {step}, then DEL")
    RAN.add(f"del:{mode}:{step}")
    pods.done()


@pytest.mark.parametrize("mode,step", GC_CASES, ids=_ids(GC_CASES))
@swept()
def test_kill_gc_then_gc_again(pods, mode, step):
    pod = pods(mode)
    node = pod.node
    before = nodestate.snapshot(node.lab, [pod.ns])
    assert_ok(node.call("ADD", pod.conf, pod.cid, pod.ns.path), "ADD")
    assert_killed(node.gc(pod.conf, fault=step), mode, step, "GC")
    assert_ok(node.gc(pod.conf), "the second GC")
    assert_baseline(pod, before, f"GC killed at {step}, then GC")
    RAN.add(f"gc:{mode}:{step}")
    pods.done()


@pytest.mark.parametrize("step", UNDO_CASES)
@swept(mode="ovs")
def test_kill_undo_of_stale_record_then_del(pods, step):
    """A re-ADD first undoes the half-made attempt its record describes; killed in that undo."""
    pod = pods("ovs")
    node = pod.node
    before = nodestate.snapshot(node.lab, [pod.ns])
    assert_killed(node.call("ADD", pod.conf, pod.cid, pod.ns.path, fault="add.pod-configured"), "ovs",
                  "add.pod-configured", "ADD")
    assert_killed(node.call("ADD", pod.conf, pod.cid, pod.ns.path, fault=step), "ovs", step,
                  "the re-ADD undoing the stale record")
    assert_ok(node.call("DEL", pod.conf, pod.cid, pod.ns.path), "DEL")
    assert_baseline(pod, before, f"re-ADD killed at {step} while undoing a stale record, then DEL")
    pods.done()


# ---- the IPAM child left alone ----------------------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
@swept()
def test_orphaned_ipam_child_allocation_is_released(pods, mode):
    pod = pods(mode)
    node, cid = pod.node, pod.cid
    before = nodestate.snapshot(node.lab, [pod.ns])
    assert_killed(node.call("ADD", pod.conf, cid, pod.ns.path, fault="ipam.child-running"), mode,
                  "ipam.child-running", "ADD")

    def children() -> list[dict[str, Any]]:
        return [p for p in nodestate.processes(node.lab).values() if p["container_id"] == cid]

    wait_until(lambda: not children(), 10, f"the orphaned IPAM child of {cid[:12]} to finish")
    held = [k for k, v in nodestate.ipam_rows(node.lab).items() if cid in json.dumps(v)]
    assert held, "the orphaned host-local allocated nothing after its parent died: nothing to prove"
    assert_ok(node.call("DEL", pod.conf, cid, pod.ns.path), "DEL")
    assert_baseline(pod, before, "ADD killed while host-local ran (the child finished alone), then DEL")
    pods.done()


# ---- random instants ---------------------------------------------------------------------------------

# Kills go on until LANDED of them have landed mid-ADD, RANDOM_TRIALS at most: on a busy
# machine an ADD's time moves, and a fixed number of trials with a share to reach made the
# test fail on load, not on a leak (every trial, landed or not, must leave nothing behind).
RANDOM_TRIALS = 30
LANDED = 8


def test_random_instant_kills(pods, lab):
    rng = random.Random(int(os.environ.get("TENANTNET_FAULTS_SEED", "12")))
    ipam = {"type": "tenantnet-ipam", "ranges": [[{"subnet": "10.184.0.0/24"}]],
            "dataDir": str(lab.root / "ipam" / "faults-random")}

    def spawn(pod: Pod) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen([PLUGIN], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, env=pod.node.env("ADD", pod.cid, pod.ns.path))
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(pod.conf).encode())
        proc.stdin.close()
        proc.stdin = None  # closed: communicate() must not flush it
        return proc

    durations = []
    for _ in range(3):  # T: an un-faulted ADD, from the exec to its result on stdout
        pod = pods("ovs", name="fltrnd", ipam=ipam)
        started = time.monotonic()
        proc = spawn(pod)
        assert proc.stdout is not None
        first = os.read(proc.stdout.fileno(), 1 << 16)  # returns with the first bytes of the result
        durations.append(time.monotonic() - started)
        rest, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, first + rest
        assert_ok(pod.node.call("DEL", pod.conf, pod.cid, pod.ns.path), "DEL")
    # The fastest un-faulted ADD bounds the draw: a delay within it finds the ADD running
    # unless the machine got quicker meanwhile.
    t = min(durations)
    landed: list[bool] = []
    for trial in range(RANDOM_TRIALS):
        if sum(landed) >= LANDED:
            break
        pod = pods("ovs", name="fltrnd", ipam=ipam)
        before = nodestate.snapshot(pod.node.lab, [pod.ns])
        delay = rng.uniform(0, t)
        proc = spawn(pod)
        time.sleep(delay)
        running = proc.poll() is None
        proc.kill()
        out, _ = proc.communicate(timeout=30)
        landed.append(running and out == b"")
        assert_ok(pod.node.call("DEL", pod.conf, pod.cid, pod.ns.path), "DEL")
        assert_baseline(pod, before, f"ADD killed at a random instant ({delay * 1000:.0f} ms of "
                                     f"T={t * 1000:.0f} ms, trial {trial}), then DEL")
    report = (f"random-instant kills: {sum(landed)}/{len(landed)} landed before the ADD completed "
              f"(T = {t * 1000:.0f} ms, delays uniform in [0, T])")
    print(report)
    assert sum(landed) >= LANDED, report
    pods.done()


def test_a_snapshot_of_an_untouched_node_is_the_same_twice(switchdev_lab, netns_factory):
    """Every kill above compares two snapshots: one of a node nothing touched must equal the
    next, or the sweep would blame noise on a step. (Its cost is printed; how long it may
    take is no pass/fail question on a shared machine.)"""
    ns = netns_factory()
    took, snaps = [], []
    for _ in range(5):
        started = time.perf_counter()
        snaps.append(nodestate.snapshot(switchdev_lab, [ns]))
        took.append(time.perf_counter() - started)
    print(f"nodestate.snapshot: median {statistics.median(took) * 1000:.1f} ms")
    assert all(nodestate.diff(snaps[0], later) == "" for later in snaps[1:])


# ---- at the end: every step was seen killed -----------------------------------------------------------

def test_every_step_was_killed_somewhere():
    """After the whole sweep ran: each (mode, step) was seen killing a process."""
    expected = {f"add:{m}:{f}:{h}" for m, f, h in ADD_CASES} | {f"del:{m}:{s}" for m, s in DEL_CASES} \
        | {f"gc:{m}:{s}" for m, s in GC_CASES}
    if not expected <= RAN:
        pytest.skip(f"only part of the sweep ran or passed ({len(RAN & expected)}/{len(expected)} cases)")
    wanted = {(m, s.name) for s in STEPS.values() for m in s.modes if reachable(s.name, m)}
    missing = wanted - CONFIRMED
    assert missing == set(), f"never seen killed: {sorted(missing)}"
