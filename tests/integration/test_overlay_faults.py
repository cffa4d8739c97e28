"""Faults on overlay networks, against the OVN lab with the real plugin exec'd in its nodes.

- The northbound database, northd, or a node's ovn-controller SIGKILLed — before an ADD and
  a DEL run, or while they run — and started again: the runtime's retries (a failed ADD is
  followed by its DEL and a new ADD, a failed DEL by another DEL) leave exactly one logical
  port per live attachment, none of a deleted one, no OVS port, veth or record of it, and
  every pod's traffic back across nodes.
- The plugin SIGKILLed at the overlay's crash points (ovn.lsp-adding, ovn.lsp-added,
  ovn.lsp-deleted), then the runtime's ADD again or DEL: the right logical ports, once.
- DEL and GC remove only logical ports tenantnet owns: GC on a node removes that node's
  logical port that no record holds, never another node's nor a foreign one (made by hand,
  even with tenantnet's name for it), and DEL leaves a foreign port of its port's name.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tenantnet.lab import ovn
from tests.integration import overlaysupport as s
from tests.integration.test_faults import overlay_steps

pytestmark = pytest.mark.root

RED = s.overlay_conf("red", 16, 250, subnet="10.88.60.0/24")
FAULT_ENV = "TENANTNET_TEST_FAULT"
INSTALL = 3  # s: ovn.installTimeout in this module's lab
# s: the installTimeout of the node an ADD runs on while a daemon is killed: such an ADD
# (northd or the node's controller gone) is meant to run out, and only the fault window's
# ADDs see it; every ADD that must succeed (setup, the retries after the restart) has INSTALL
FAULT_INSTALL = 1
# s: that node's ovn.timeout (NB transaction, reconnection wait) in the same window: an ADD
# that met the NB killed under it answers 11 after this, not after the 5 s default, and
# northd's reconnection backoff (doubling while the NB is away) stays short
FAULT_NB_TIMEOUT = 2
TRY_AGAIN = 11


@dataclass
class World:
    lab: ovn.OvnLab
    count: int = 0
    pods: list[s.Pod] = field(default_factory=list)  # every pod made, live or deleted

    def pod(self, node: int) -> s.Pod:
        self.count += 1
        pod = s.new_pod(self.lab, self.lab.nodes[node], f"p{self.count}", RED)
        self.pods.append(pod)
        return pod

    def live(self, node: int) -> s.Pod:
        pod = self.pod(node)
        inv = s.add(pod)
        assert inv.code == 0, inv
        return pod

    def live_on(self, *nodes: int) -> list[s.Pod]:
        """One live pod on each of `nodes` (all different): their ADDs run at once."""
        assert len(set(nodes)) == len(nodes)
        pods = [self.pod(node) for node in nodes]
        for pod, inv in zip(pods, s.concurrently([lambda pod=pod: s.add(pod) for pod in pods]), strict=True):
            assert inv.code == 0, (pod.name, inv)
        return pods


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ovn.OvnLab]:
    root = str(tmp_path_factory.mktemp("ovnfault") / "lab")
    made = ovn.up(root, nodes=3)
    # An ADD waits for ovn-controller's flows (ovn.installTimeout): with northd or a
    # controller away that wait runs out, so it is kept short here.
    for node in made.nodes:
        text = Path(node.node_config).read_text()
        assert "  timeout: 5\n" in text
        Path(node.node_config).write_text(
            text.replace("  timeout: 5\n", f"  timeout: 5\n  installTimeout: {INSTALL}\n"))
    try:
        yield made
    finally:
        ovn.down(root)


@pytest.fixture
def world(lab: ovn.OvnLab) -> Iterator[World]:
    """Each test's pods, all DELeted at its end (the lab's daemons started again if a failed
    test left one stopped), so the next test starts from an NB without tenantnet ports."""
    made = World(lab, count=len(ovn._lab_netns(lab.tag)))
    yield made
    for daemon in [*(s.central_daemon(lab, d) for d in ovn.CENTRAL_DAEMONS), *map(s.controller, lab.nodes)]:
        if ovn._pid(daemon.rundir, daemon.name) is None:
            s.start(daemon)
    # the nodes' DELs at once, each node's one after another (as its kubelet would)
    by_node: dict[str, list[s.Pod]] = {}
    for pod in made.pods:
        by_node.setdefault(pod.node.name, []).append(pod)
    s.concurrently([lambda pods=pods: [s.delete(pod) for pod in pods] for pods in by_node.values()])
    assert _tenantnet_lsps(lab) == []


def _set_timeouts(node: ovn.OvnNode, nb: float, install: float) -> None:
    path = Path(node.node_config)
    lines = [f"  timeout: {nb}" if line.startswith("  timeout: ") else
             f"  installTimeout: {install}" if line.startswith("  installTimeout: ") else line
             for line in path.read_text().splitlines()]
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(path)  # a plugin starting meanwhile reads the old file or the new one, never half


@contextmanager
def fault_window(node: ovn.OvnNode) -> Iterator[None]:
    """`node`'s plugin runs with ovn.timeout FAULT_NB_TIMEOUT and installTimeout
    FAULT_INSTALL (5 and INSTALL again afterwards)."""
    _set_timeouts(node, FAULT_NB_TIMEOUT, FAULT_INSTALL)
    try:
        yield
    finally:
        _set_timeouts(node, 5, INSTALL)


def _tenantnet_lsps(lab: ovn.OvnLab) -> list[str]:
    return sorted(name for name, ids in s.logical_ports(lab) if ids.get("tenantnet-owner") == "tenantnet")


def leftovers(lab: ovn.OvnLab, pod: s.Pod) -> list[str]:
    """What is left of a deleted attachment (empty: nothing)."""
    left = [f"LSP {name}" for name in s.ports_of(lab, pod)]
    left += [f"OVS port {name}" for name, ids in s.ovs_ports(pod.node) if ids.get("tenantnet-container-id") ==
             pod.container_id]
    left += [f"record {p}" for p in s.records(pod.node) if pod.container_id in str(p)]
    if pod.run("ip", "link", "show", pod.ifname).returncode == 0:
        left.append(f"{pod.ifname} in {pod.netns}")
    return left


def settle(lab: ovn.OvnLab, live: list[s.Pod], gone: list[s.Pod]) -> None:
    """0 duplicate ports, 0 leaked ports, nothing of a deleted attachment, traffic back."""
    names = [name for name, _ in s.logical_ports(lab)]
    assert len(names) == len(set(names)), f"duplicate logical ports: {sorted(names)}"
    want = {pod.container_id for pod in live}
    have = [ids["tenantnet-container-id"] for _, ids in s.logical_ports(lab) if "tenantnet-container-id" in ids]
    assert sorted(have) == sorted(want), f"logical ports of {have}, live attachments {want}"
    for pod in live:
        assert len(s.ports_of(lab, pod)) == 1
        assert [ids for _, ids in s.ovs_ports(pod.node) if ids.get("tenantnet-container-id") == pod.container_id]
    left = {pod.name: leftovers(lab, pod) for pod in gone}
    assert not any(left.values()), left
    # every live pod reaches every live pod on another node (a restarted controller takes a
    # moment to bind again: ping keeps trying for a while); all pairs at once
    pairs = [(a, b) for a in live for b in live if a.node.name != b.node.name]
    reached = s.concurrently([lambda a=a, b=b: s.ping(a, b.ip, deadline=15) for a, b in pairs])
    unreachable = [(a.name, b.name) for (a, b), ok in zip(pairs, reached, strict=True) if not ok]
    assert not unreachable, unreachable


def _daemon(lab: ovn.OvnLab, which: str) -> s.Daemon:
    if which == "nb":
        return s.central_daemon(lab, "ovsdb-server-nb")
    if which == "northd":
        return s.central_daemon(lab, "ovn-northd")
    return s.controller(lab.nodes[1])  # node2's


def _restart(lab: ovn.OvnLab, daemon: s.Daemon) -> None:
    """Start the daemon again and wait until the whole control plane has caught up (northd
    back on the NB, every chassis's ovn-controller on the SB: `--wait=hv sync`). A runtime
    retries an ADD until it works; the tests retry once, so they wait for what those retries
    would: after an NB restart northd's reconnection backoff alone can outlast installTimeout."""
    s.start(daemon)
    ovn.nbctl(lab.root, "--timeout=60", "--wait=hv", "sync")


def _retry(new: s.Pod, added: s.Invocation, old: s.Pod, deleted: s.Invocation) -> None:
    """The runtime's retries: a failed ADD (of `new`) is DELeted and ADDed again, a failed DEL
    (of `old`) repeated."""
    if added.code != 0:
        assert s.delete(new).code == 0
        retried = s.add(new)
        assert retried.code == 0, retried
    if deleted.code != 0:
        again = s.delete(old)
        assert again.code == 0, again


@pytest.mark.parametrize("which", ["nb", "northd", "controller"])
def test_daemon_down_during_add_and_del(world: World, which: str) -> None:
    """The daemon is dead while an ADD (on node2) and a DEL (of a node2 pod) run. Without the
    NB both fail with code 11 (try again) and leave no OVS port or veth behind. Without
    northd or node2's ovn-controller the NB takes the writes, but nobody installs the new
    port's flows: the ADD waits ovn.installTimeout, answers 11 and is undone (no logical
    port, OVS port, veth or record), and the DEL, which needs neither, succeeds. After the
    restart and the runtime's retries: the right logical ports, once, and traffic. The ADD
    and the DEL run at the same time (as a runtime may run them), node2's timeouts shortened
    for them (fault_window)."""
    lab = world.lab
    a, old, far = world.live_on(0, 1, 2)
    daemon = _daemon(lab, which)
    s.kill(daemon)
    new = world.pod(1)
    with fault_window(new.node):
        added, deleted = s.concurrently([lambda: s.add(new), lambda: s.delete(old)])
    if which == "nb":
        assert (added.code, deleted.code) == (1, 1), (added, deleted)
        for inv in (added, deleted):
            assert json.loads(inv.stdout)["code"] == TRY_AGAIN, inv.stdout
        # the failed ADD was undone on the node: no OVS port, no pod interface
        assert not [ids for _, ids in s.ovs_ports(new.node) if ids.get("tenantnet-container-id") ==
                    new.container_id]
        assert new.run("ip", "link", "show", new.ifname).returncode != 0
        # the runtime's DEL after a failed ADD, while the NB is still away: done, or try again
        # (a record kept for a logical port the rollback could not confirm gone)
        cleanup = s.delete(new)
        assert cleanup.code == 0 or json.loads(cleanup.stdout)["code"] == TRY_AGAIN, cleanup
    else:
        assert added.code == 1 and deleted.code == 0, (added, deleted)
        refusal = json.loads(added.stdout)
        assert refusal["code"] == TRY_AGAIN and "did not install" in refusal["msg"], refusal
        assert leftovers(lab, new) == []
        assert s.delete(new).code == 0  # the runtime's DEL after a failed ADD: nothing to do
    _restart(lab, daemon)
    _retry(new, added, old, deleted)
    settle(lab, live=[a, new, far], gone=[old])


MID = 0.2  # s into the ADD and DEL when the daemon is killed


@pytest.mark.parametrize("which", ["nb", "northd", "controller"])
def test_daemon_killed_mid_add_and_del(world: World, which: str) -> None:
    """An ADD and a DEL running on node2 while the daemon is SIGKILLed MID s into them
    (an exec'd overlay ADD takes ~0.35 s here): each either succeeds or answers 11; after
    the restart and the runtime's retries, the same end state as without the crash.

    One delay only. 0.05 s (run here before) kills the daemon while the plugin's interpreter
    is still starting, long before it talks to the NB: the case of
    test_daemon_down_during_add_and_del, which it proved again. 0.2 s lands around the NB
    write (the port appears ~0.21-0.34 s after the exec here), on either side of it from run
    to run (with the NB killed the ADD answered 0 in some runs, 11 in others); both sides
    are also hit exactly, by the crash points ovn.lsp-adding and ovn.lsp-added
    (test_sigkill_at_an_overlay_point_of_add). node2's timeouts are short (fault_window)
    while the killed daemon is away."""
    after = MID
    lab = world.lab
    a, old = world.live_on(0, 1)
    new = world.pod(1)
    daemon = _daemon(lab, which)
    procs = {}
    done = {}
    with fault_window(new.node):
        for command, pod in (("ADD", new), ("DEL", old)):
            env = s.cni_env(command, pod.node, pod.container_id, pod.netns, pod.ifname)
            procs[command] = subprocess.Popen(ovn.in_node(pod.node, [s.PLUGIN]), env=env, stdin=subprocess.PIPE,
                                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            assert procs[command].stdin is not None
            procs[command].stdin.write(json.dumps(RED))
            procs[command].stdin.close()
        time.sleep(after)
        s.kill(daemon)
        for command, proc in procs.items():
            proc.wait(timeout=60)
            assert proc.stdout is not None and proc.stderr is not None
            stdout, stderr = proc.stdout.read(), proc.stderr.read()
            done[command] = s.Invocation(proc.returncode, stdout, stderr)
            if proc.returncode != 0:
                assert json.loads(stdout)["code"] == TRY_AGAIN, (command, stdout, stderr)
    print(f"\n{which} killed {after} s in: ADD -> {done['ADD'].code}, DEL -> {done['DEL'].code}")
    _restart(lab, daemon)
    if done["ADD"].code == 0:
        s.take_result(new, done["ADD"])
    _retry(new, done["ADD"], old, done["DEL"])
    settle(lab, live=[a, new], gone=[old])


# The overlay's crash points, from the code (test_faults.py finds every faults.step and leaves
# the `ovn.` ones to this module): the DEL's one is killed below, every other one on an ADD.
OVERLAY_STEPS = overlay_steps()
DEL_POINT = "ovn.lsp-deleted"
ADD_POINTS = [step for step in OVERLAY_STEPS if step != DEL_POINT]


def test_every_overlay_step_is_exercised() -> None:
    assert DEL_POINT in OVERLAY_STEPS and len(ADD_POINTS) >= 3, OVERLAY_STEPS
    assert {"ovn.lsp-adding", "ovn.lsp-added", "ovn.installed"} <= set(ADD_POINTS), ADD_POINTS


@pytest.mark.parametrize(("point", "then"), [(p, then) for p in ADD_POINTS for then in ("ADD", "DEL")])
def test_sigkill_at_an_overlay_point_of_add(world: World, point: str, then: str) -> None:
    """The plugin dies at the crash point of an ADD on node2; the runtime then ADDs again
    (the pod is kept) or DELetes it: exactly its one logical port, or none."""
    a = world.live(0)
    pod = world.pod(1)
    killed = s.add(pod, extra_env={FAULT_ENV: point})
    assert killed.code == -signal.SIGKILL and killed.stdout == "", killed
    if point != "ovn.lsp-adding":  # the crash came after the NB write: the port is there
        assert len(s.ports_of(world.lab, pod)) == 1
    if then == "ADD":
        again = s.add(pod)
        assert again.code == 0, again
        settle(world.lab, live=[a, pod], gone=[])
    else:
        assert s.delete(pod).code == 0
        settle(world.lab, live=[a], gone=[pod])


def test_sigkill_after_the_logical_port_is_deleted(world: World) -> None:
    """The plugin dies just after a DEL removed the logical port (OVS port, veth and record
    still there); the runtime's DEL again finishes, and the other pods are untouched."""
    a, b, pod = world.live_on(0, 2, 1)
    killed = s.delete(pod, extra_env={FAULT_ENV: DEL_POINT})
    assert killed.code == -signal.SIGKILL, killed
    assert s.ports_of(world.lab, pod) == []
    assert s.records(pod.node), "the record went before the DEL finished"
    assert s.delete(pod).code == 0
    settle(world.lab, live=[a, b], gone=[pod])


def test_gc_and_del_remove_only_tenantnet_ports_of_their_node(world: World) -> None:
    """GC on node1 with node1's live attachment as valid: node1's logical port that no record
    holds (a leak, written by hand with tenantnet's ids) goes; node2's live port, a port with
    tenantnet's ids of node2, and a foreign port (no ids, on the same switch) stay. A DEL of an
    attachment whose port name a foreign port has taken leaves that port alone."""
    from tenantnet.plugin.drivers import ovnport

    lab = world.lab
    kept, other = world.live_on(0, 1)
    leak_cid = s.container_id("leaked")
    leak = ovnport.port_name("node1", leak_cid, "net1")
    ids = ["external_ids:tenantnet-owner=tenantnet", "external_ids:tenantnet-network=red",
           "external_ids:tenantnet-node={}", f"external_ids:tenantnet-container-id={leak_cid}",
           "external_ids:tenantnet-ifname=net1", "external_ids:tenantnet-switch=tn-red"]
    node2_cid = s.container_id("node2-unrecorded")
    node2_port = ovnport.port_name("node2", node2_cid, "net1")
    ovn.nbctl(lab.root, "lsp-add", "tn-red", leak, "--", "set", "Logical_Switch_Port", leak,
              *(i.format("node1") for i in ids))
    ovn.nbctl(lab.root, "lsp-add", "tn-red", node2_port, "--", "set", "Logical_Switch_Port", node2_port,
              *(i.format("node2").replace(leak_cid, node2_cid) for i in ids))
    ovn.nbctl(lab.root, "lsp-add", "tn-red", "foreign-port", "--", "lsp-set-addresses", "foreign-port",
              "0a:00:00:00:f0:01 10.88.60.251")
    # a foreign port under the name a DEL on node1 would compute for this attachment
    squat_cid = s.container_id("squatted")
    squat = ovnport.port_name("node1", squat_cid, "net1")
    ovn.nbctl(lab.root, "lsp-add", "tn-red", squat)
    try:
        gc = s.gc(lab.nodes[0], RED, valid=[(kept.container_id, kept.ifname)])
        assert gc.code == 0, gc
        names = [name for name, _ in s.logical_ports(lab)]
        assert leak not in names, names
        for survivor in (*s.ports_of(lab, kept), *s.ports_of(lab, other), node2_port, "foreign-port", squat):
            assert names.count(survivor) == 1, (survivor, names)
        squatted = s.Pod("squat", lab.nodes[0], world.pods[0].netns, squat_cid, RED)
        deleted = s.delete(squatted)
        assert deleted.code == 0, deleted
        assert squat in [name for name, _ in s.logical_ports(lab)]
        # GC without the live attachment: its port, OVS port and record go; node2's stays
        assert s.gc(lab.nodes[0], RED, valid=[]).code == 0
        assert s.ports_of(lab, kept) == [] and len(s.ports_of(lab, other)) == 1
        assert not [i for _, i in s.ovs_ports(kept.node) if i.get("tenantnet-container-id") == kept.container_id]
    finally:
        for name in (leak, node2_port, "foreign-port", squat):
            ovn.nbctl(lab.root, "--if-exists", "lsp-del", name)
