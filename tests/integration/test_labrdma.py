"""The lab's simulated RDMA control (tenantnet.lab.rdma) against real network namespaces:
into a namespace and back, exclusive-mode rules (shared mode refuses, only the holder can
give a device up), a deleted namespace hands its devices back, concurrent processes are
serialised. No RDMA hardware: the devices are the simulated NIC's sysfs entries."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tenantnet.lab import rdma as labrdma
from tenantnet.lab.nicsysfs import connectx_pf, e810_pf, write_tree
from tenantnet.plugin.system import rdmacontrol
from tenantnet.plugin.system.netns import NamespaceNotFound
from tenantnet.plugin.system.rdmacontrol import (
    RdmaDeviceNotFound,
    RdmaProblem,
    RdmaSharedMode,
    netns_identity,
)

pytestmark = pytest.mark.root
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def control(tmp_path: Path) -> labrdma.LabRdmaControl:
    # ConnectX VFs 0..2 carry mlx5_2..mlx5_4; the E810's VFs have no RDMA device.
    write_tree(tmp_path / "sys", [connectx_pf("lpf0", vfs=3), e810_pf("lpf1", vfs=1)])
    return labrdma.LabRdmaControl(str(tmp_path))


def test_devices_come_from_the_simulated_nic(control: labrdma.LabRdmaControl) -> None:
    assert control.rdma.devices() == {"mlx5_2": "0000:3b:00.2", "mlx5_3": "0000:3b:00.3", "mlx5_4": "0000:3b:00.4"}
    assert control.netns_mode() == "exclusive"  # the lab's default (the kernel's is shared)
    with pytest.raises(RdmaDeviceNotFound, match="lab RDMA simulation: no RDMA device mlx5_9") as err:
        control.where("mlx5_9")
    assert err.value.errno == errno.ENODEV


def test_duplicate_device_names_are_refused(tmp_path: Path) -> None:
    # Two ConnectX PFs with the default numbering both name their first VF's device mlx5_2.
    write_tree(tmp_path / "sys", [connectx_pf("lpf0", vfs=1), connectx_pf("lpf2", vfs=1, bus="af")])
    with pytest.raises(RdmaProblem, match=r"mlx5_2 appears under two PCI devices \(0000:3b:00.2, 0000:af:00.2\)"):
        labrdma.LabRdmaControl(str(tmp_path)).where("mlx5_2")


@pytest.fixture
def process_in() -> Iterator[Callable[[Any], int]]:
    """Starts a process inside a namespace (to name the namespace by /proc/PID/ns/net)."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(ns: Any) -> int:
        proc = subprocess.Popen(["ip", "netns", "exec", ns.name, "sleep", "30"])
        procs.append(proc)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                if os.stat(f"/proc/{proc.pid}/ns/net").st_ino == os.stat(ns.path).st_ino:
                    return proc.pid
            except FileNotFoundError:
                pass
            time.sleep(0.005)
        raise AssertionError(f"ip netns exec {ns.name} did not enter the namespace")

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def test_into_a_namespace_and_back(control: labrdma.LabRdmaControl, netns_factory: Callable[[], Any],
                                   process_in: Callable[[Any], int]) -> None:
    pod = netns_factory()
    assert control.where("mlx5_2") is None
    control.move("mlx5_2", pod.path)
    assert control.where("mlx5_2") == netns_identity(pod.path)
    assert control.where("mlx5_2") == netns_identity(f"/proc/{process_in(pod)}/ns/net")  # any path naming it
    control.move("mlx5_2", pod.path)  # a repeated ADD: nothing to do
    [entry] = [d for d in control.describe() if d["device"] == "mlx5_2"]
    assert entry == {"device": "mlx5_2", "pciAddress": "0000:3b:00.2", "simulated": True,
                     "netnsMode": "exclusive", "netns": str(netns_identity(pod.path)), "netnsPath": pod.path}
    assert control.where("mlx5_3") is None  # the others stay
    assert control.return_to_host("mlx5_2", pod.path)
    assert control.where("mlx5_2") is None
    assert control.return_to_host("mlx5_2", pod.path)  # a repeated DEL
    assert json.loads(control.rdma.state_path.read_text()) == {"holders": {}, "mode": "exclusive",
                                                               "simulated": True}


def test_shared_mode_refuses_moves(control: labrdma.LabRdmaControl, netns_factory: Callable[[], Any]) -> None:
    pod = netns_factory()
    control.set_netns_mode("shared")
    assert control.netns_mode() == "shared"
    with pytest.raises(RdmaSharedMode) as err:
        control.move("mlx5_2", pod.path)
    assert err.value.errno == errno.EOPNOTSUPP  # as ib_device_set_netns_put in shared mode
    assert str(err.value).startswith("lab RDMA simulation: cannot move RDMA device mlx5_2 into ")
    assert "rdma system set netns exclusive" in str(err.value)
    assert control.where("mlx5_2") is None
    assert control.return_to_host("mlx5_2", pod.path)  # shared: every device is the host's
    with pytest.raises(ValueError, match="allowed are shared, exclusive"):
        control.set_netns_mode("private")


def test_mode_change_refused_while_a_device_is_away(control: labrdma.LabRdmaControl,
                                                     netns_factory: Callable[[], Any]) -> None:
    control.move("mlx5_2", netns_factory().path)
    with pytest.raises(RdmaProblem, match=r"cannot switch to shared netns mode .*\(mlx5_2\)") as err:
        control.set_netns_mode("shared")
    assert err.value.errno == errno.EBUSY


def test_only_the_holder_gives_a_device_up(control: labrdma.LabRdmaControl,
                                           netns_factory: Callable[[], Any]) -> None:
    a, b = netns_factory(), netns_factory()
    control.move("mlx5_2", a.path)
    with pytest.raises(RdmaDeviceNotFound, match=r"mlx5_2 is not in the host network namespace \(it is in net:") as err:
        control.move("mlx5_2", b.path)
    assert err.value.errno == errno.ENODEV
    assert not control.return_to_host("mlx5_2", b.path)  # b does not hold it
    assert not control.return_to_host("mlx5_2", None)  # nor can it be reached without its namespace
    assert control.where("mlx5_2") == netns_identity(a.path)


def test_a_deleted_namespace_hands_its_devices_back(control: labrdma.LabRdmaControl,
                                                    netns_factory: Callable[[], Any]) -> None:
    pod, next_pod = netns_factory(), netns_factory()
    control.move("mlx5_2", pod.path)
    control.move("mlx5_3", pod.path)
    pod.delete()
    assert control.where("mlx5_2") is None
    assert control.return_to_host("mlx5_3", pod.path)  # DEL after the netns is gone
    assert control.return_to_host("mlx5_3", None)  # DEL with CNI_NETNS=""
    control.move("mlx5_2", next_pod.path)  # free for the next pod
    assert control.where("mlx5_2") == netns_identity(next_pod.path)


def test_bad_targets(control: labrdma.LabRdmaControl, tmp_path: Path) -> None:
    with pytest.raises(NamespaceNotFound):
        control.move("mlx5_2", str(tmp_path / "no-such-netns"))
    not_a_netns = tmp_path / "plain-file"
    not_a_netns.write_text("")
    with pytest.raises(RdmaProblem, match="is not a network namespace") as err:
        control.move("mlx5_2", str(not_a_netns))
    assert err.value.errno == errno.EINVAL  # as get_net_ns_by_fd for a fd that is no netns
    control.move("mlx5_2", rdmacontrol.THREAD_NETNS)  # into the host: it is there
    assert control.where("mlx5_2") is None


def test_registered_under_its_scheme(tmp_path: Path) -> None:
    control = rdmacontrol.control_for(f"lab-rdma:{tmp_path}", ["tenantnet.lab.rdma"])
    assert isinstance(control, labrdma.LabRdmaControl)
    assert control.rdma.root == tmp_path


CHILD = r"""
import json, sys
from tenantnet.lab.rdma import LabRdmaControl
from tenantnet.plugin.system.rdmacontrol import RdmaProblem

lab, own_device, netns, rounds, contested = sys.argv[1:6]
control = LabRdmaControl(lab)
sys.stdin.readline()  # start with the other process
try:
    control.move(contested, netns)
    won = True
except RdmaProblem as exc:
    won = exc.errno
for _ in range(int(rounds)):
    control.move(own_device, netns)
    assert control.return_to_host(own_device, netns)
control.move(own_device, netns)
print(json.dumps({"won": won}))
"""


def test_concurrent_processes_are_serialised(control: labrdma.LabRdmaControl,
                                             netns_factory: Callable[[], Any]) -> None:
    """Two processes race for one device (exactly one gets it), then each moves its own device
    in and out many times: with the state file's lock no update is lost."""
    a, b = netns_factory(), netns_factory()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, str(control.rdma.root), device, ns.path, "15",
                               "mlx5_4"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env)
             for device, ns in (("mlx5_2", a), ("mlx5_3", b))]
    try:
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        outcomes = []
        for proc in procs:
            out, err = proc.communicate(timeout=30)
            assert proc.returncode == 0, err
            outcomes.append(json.loads(out)["won"])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert sorted(outcomes, key=str) == sorted([True, errno.ENODEV], key=str)
    winner = (a, b)[outcomes.index(True)]
    assert control.where("mlx5_4") == netns_identity(winner.path)
    assert control.where("mlx5_2") == netns_identity(a.path)
    assert control.where("mlx5_3") == netns_identity(b.path)
