"""Fixtures for root tests: a private OVS lab per session, pod namespaces, the plugin exec.

Everything here creates its own objects (netns named `tnt-<random>`, the lab in a pytest
temp dir) and removes them afterwards, also when a test fails. Nothing system-wide is
touched; processes are stopped by their own pid files.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tenantnet.lab import node as labmod

BIN = Path(sys.executable).parent
PLUGIN = str(BIN / "tenantnet")
GO_PLUGINS = "/usr/lib/cni"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Never skip or xfail: without root these tests cannot run, so each one fails, loudly
    # (`_needs_root` below; an xfail(run=False) would turn a non-root run green).
    for item in items:
        if "integration" in str(item.fspath):
            item.add_marker(pytest.mark.root)


@pytest.fixture(scope="session", autouse=True)
def _needs_root() -> None:
    """Every integration test fails (reported in its setup) when not run as root."""
    if os.geteuid() != 0:
        pytest.fail(f"needs root: the integration tests need network namespaces and a private Open "
                    f"vSwitch (running as uid {os.geteuid()}; run `sudo make integration`)", pytrace=False)


@dataclass
class Lab:
    root: Path
    node_config: Path
    state_dir: Path
    ovsdb: str
    bridge: str
    hostlocal_dir: Path

    def vsctl(self, *args: str) -> str:
        return labmod.vsctl(str(self.root), *args)

    def owned_ports(self) -> list[str]:
        out = self.vsctl("--format=json", "--columns=name,external_ids", "list", "Port")
        names = []
        for name, ids in json.loads(out)["data"]:
            if dict(ids[1]).get("tenantnet-owner") == "tenantnet":
                names.append(name)
        return names

    def records(self) -> list[Path]:
        """Every file under the records directory: records, and temp files a crashed write
        left (`*.json.tmp.<pid>`), which a leak check must see too."""
        return sorted(p for p in (self.state_dir / "attachments").rglob("*") if p.is_file())

    def allocations(self) -> list[str]:
        """Addresses held in this lab's IPAM directories, for leak checks: host-local's files
        (one per IP) and the rows of any tenantnet-ipam store (its files are no allocation)."""
        import sqlite3

        out = []
        for directory in (self.hostlocal_dir, self.root / "ipam"):
            for f in directory.rglob("*"):
                if not f.is_file() or f.name.startswith(("last_reserved_ip", "lock")):
                    continue
                if f.name == "ipam.db":
                    with sqlite3.connect(f) as db:
                        out += [f"{f.parent.name}:{a}" for (a,) in db.execute("SELECT address FROM allocation")]
                elif not f.name.startswith("ipam."):
                    out.append(f.name)
        return sorted(out)


@pytest.fixture(scope="session")
def ovn_installed() -> None:
    """The OVN modules need OVN's daemons and NB schema, which `make test` installs (make
    deps: ovn-central, ovn-host): missing, they fail here rather than skip unseen."""
    from tenantnet.lab import nbserver

    missing = [tool for tool in ("ovsdb-server", "ovn-northd", "ovn-controller") if shutil.which(tool) is None]
    if not nbserver.NB_SCHEMA.exists():
        missing.append(str(nbserver.NB_SCHEMA))
    if missing:
        pytest.fail(f"OVN is not installed (missing: {', '.join(missing)}): run make deps", pytrace=False)


@pytest.fixture(scope="session")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    root = tmp_path_factory.mktemp("lab")
    info = labmod.up(str(root / "run"))
    try:
        yield Lab(
            root=Path(info.root), node_config=Path(info.node_config), state_dir=Path(info.state_dir),
            ovsdb=info.ovsdb, bridge=info.bridge, hostlocal_dir=Path(info.root) / "host-local",
        )
    finally:
        labmod.down(info.root)


@pytest.fixture(scope="session")
def nic_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """A second lab with a simulated SR-IOV NIC: 6 VFs, the last bound to vfio-pci (DPDK)."""
    root = tmp_path_factory.mktemp("niclab")
    info = labmod.up(str(root / "run"), vfs=6, dpdk_vfs=1)
    try:
        yield Lab(root=Path(info.root), node_config=Path(info.node_config), state_dir=Path(info.state_dir),
                  ovsdb=info.ovsdb, bridge=info.bridge, hostlocal_dir=Path(info.root) / "host-local")
    finally:
        labmod.down(info.root)


@pytest.fixture(scope="session")
def switchdev_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """A lab whose simulated NIC is in switchdev mode: 4 VFs with representors, PF on br-lab."""
    root = tmp_path_factory.mktemp("swlab")
    info = labmod.up(str(root / "run"), vfs=4, switchdev=True)
    try:
        yield Lab(root=Path(info.root), node_config=Path(info.node_config), state_dir=Path(info.state_dir),
                  ovsdb=info.ovsdb, bridge=info.bridge, hostlocal_dir=Path(info.root) / "host-local")
    finally:
        labmod.down(info.root)


@dataclass
class Netns:
    name: str

    @property
    def path(self) -> str:
        return f"/run/netns/{self.name}"

    def run(self, *cmd: str, check: bool = False) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["ip", "netns", "exec", self.name, *cmd], capture_output=True,
                              text=True, check=check)

    def delete(self) -> None:
        subprocess.run(["ip", "netns", "delete", self.name], capture_output=True, check=False)


@contextlib.contextmanager
def netns_maker() -> Iterator[Callable[[], Netns]]:
    """A maker of fresh network namespaces, each deleted when the block ends (also on failure)."""
    made: list[Netns] = []

    def make() -> Netns:
        ns = Netns(f"tnt-{uuid.uuid4().hex[:10]}")
        subprocess.run(["ip", "netns", "add", ns.name], check=True, capture_output=True)
        made.append(ns)
        return ns

    try:
        yield make
    finally:
        for ns in made:
            ns.delete()


@pytest.fixture
def netns_factory() -> Iterator[Callable[[], Netns]]:
    with netns_maker() as make:
        yield make


@dataclass
class Invocation:
    code: int
    out: dict[str, Any] | None
    stdout: str
    stderr: str


@dataclass
class PluginRunner:
    lab: Lab
    extra_env: dict[str, str] = field(default_factory=dict)
    cleanups: list[tuple[dict[str, Any], str, str]] = field(default_factory=list)
    attempts: list[tuple[dict[str, Any], str, str]] = field(default_factory=list)
    # What is exec'd: the venv's `tenantnet` (the trampoline when built); test_agent_protocol
    # also runs its suite through the Python shim (`tenantnet-shim`).
    executable: str = PLUGIN

    def conf(self, **overrides: Any) -> dict[str, Any]:
        base: dict[str, Any] = {
            "cniVersion": "1.0.0",
            "name": "testnet",
            "type": "tenantnet",
            "bridge": self.lab.bridge,
            "vlan": 100,
            "ipam": {
                "type": "host-local",
                "ranges": [[{"subnet": "10.77.0.0/24"}]],
                "dataDir": str(self.lab.hostlocal_dir),
            },
        }
        base.update(overrides)
        return {k: v for k, v in base.items() if v is not None}

    def env(self, command: str, container_id: str = "", netns: str = "", ifname: str = "",
            cni_args: str = "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns1;K8S_POD_NAME=pod1") -> dict[str, str]:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "CNI_COMMAND": command,
            "CNI_PATH": f"{BIN}:{GO_PLUGINS}",
            "TENANTNET_CONFIG": str(self.lab.node_config),
        }
        if container_id:
            env["CNI_CONTAINERID"] = container_id
        if netns is not None:
            env["CNI_NETNS"] = netns
        if ifname:
            env["CNI_IFNAME"] = ifname
        if cni_args:
            env["CNI_ARGS"] = cni_args
        env.update(self.extra_env)
        return env

    def raw(self, env: dict[str, str], stdin: bytes | str, timeout: float = 60) -> Invocation:
        if env.get("CNI_COMMAND") == "ADD":
            self.attempts.append(({}, env.get("CNI_CONTAINERID", ""), env.get("CNI_IFNAME", "")))
        data = stdin.encode() if isinstance(stdin, str) else stdin
        proc = subprocess.run([self.executable], input=data, env=env, capture_output=True, timeout=timeout,
                              check=False)
        stdout = proc.stdout.decode()
        out = json.loads(stdout) if stdout.strip() else None
        return Invocation(proc.returncode, out, stdout, proc.stderr.decode())

    def call(self, command: str, conf: dict[str, Any], container_id: str = "", netns: str = "",
             ifname: str = "net1", **kw: Any) -> Invocation:
        inv = self.raw(self.env(command, container_id, netns, ifname, **kw), json.dumps(conf))
        if command == "ADD" and inv.code == 0:
            self.cleanups.append((conf, container_id, ifname))
        elif command == "DEL" and inv.code == 0:
            # Taken down by the test itself: the fixture's clean-up DELs (best effort, results
            # unchecked, after the leak checks) are for what a failing test left attached, and
            # replaying a plugin exec for each of these proved nothing.
            self.cleanups[:] = [c for c in self.cleanups
                                if (c[0].get("name"), c[1], c[2]) != (conf.get("name"), container_id, ifname)]
        return inv

    def add(self, conf: dict[str, Any], ns: Netns, cid: str | None = None, ifname: str = "net1",
            **kw: Any) -> Invocation:
        return self.call("ADD", conf, cid or new_cid(), ns.path, ifname, **kw)


def new_cid() -> str:
    return uuid.uuid4().hex + uuid.uuid4().hex


def _runner(lab: Lab) -> Iterator[PluginRunner]:
    runner = PluginRunner(lab)
    yield runner
    # Best-effort teardown of whatever a failing test left attached (a copy: a DEL that
    # succeeds leaves the list).
    for conf, cid, ifname in list(reversed(runner.cleanups)):
        runner.call("DEL", conf, cid, "", ifname)


@pytest.fixture
def plugin(lab: Lab) -> Iterator[PluginRunner]:
    yield from _runner(lab)


@pytest.fixture
def vfp(nic_lab: Lab) -> Iterator[PluginRunner]:
    """The plugin on the lab with a simulated SR-IOV NIC."""
    yield from _runner(nic_lab)


@pytest.fixture
def off(switchdev_lab: Lab) -> Iterator[PluginRunner]:
    """The plugin on the lab whose simulated NIC is in switchdev mode."""
    yield from _runner(switchdev_lab)


@pytest.fixture
def no_leftovers(lab: Lab, plugin: PluginRunner) -> Iterator[None]:
    """Assert that a test leaves the node as it found it: the whole node state (OVS rows,
    host links, VF state, device-info files, IPAM rows, records and temp files, processes:
    tests/integration/nodestate.py) compared before and after, plus the named checks below
    (which give the clearer message when they fail)."""
    from tests.integration import nodestate

    before = nodestate.snapshot(lab)
    yield
    from tenantnet.plugin.drivers.ovs import host_ifname

    assert nodestate.diff(before, nodestate.snapshot(lab)) == "", "the node state changed"
    assert lab.owned_ports() == [], "OVS ports left behind"
    assert lab.records() == [], "attachment records left behind"
    assert lab.allocations() == [], "IP allocations left behind"
    ours = {host_ifname(cid, ifname) for _, cid, ifname in plugin.attempts}
    left = {name for name in ours if os.path.exists(f"/sys/class/net/{name}")}
    assert left == set(), "host links left behind"


@pytest.fixture
def run_dir() -> Iterator[Path]:
    """A private directory for agents' sockets and configs. Not pytest's tmp_path: a unix
    socket path must stay under 108 bytes."""
    path = Path(tempfile.mkdtemp(prefix="tna-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def agents() -> Iterator[list[Any]]:
    """Every agent a test starts (tests/integration/test_agent.py AgentProcess) goes in here
    and is stopped, by its pid, afterwards, pass or fail."""
    started: list[Any] = []
    yield started
    for a in started:
        a.stop()

