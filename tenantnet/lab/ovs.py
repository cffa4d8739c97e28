"""The lab's private Open vSwitch: where its files are, and running its tools.

A simulation aid, labelled as one: used by the lab node (`tenantnet/lab/node.py`) and its
simulated NIC (`tenantnet/lab/nic.py`), never by the plugin.
"""

from __future__ import annotations

import os
import subprocess


class LabError(Exception):
    pass



def paths(root: str) -> dict[str, str]:
    return {
        "db": os.path.join(root, "conf.db"),
        "sock": os.path.join(root, "db.sock"),
        "node_config": os.path.join(root, "tenantnet.yaml"),
        "state": os.path.join(root, "state"),
        "log": os.path.join(root, "log", "tenantnet.log"),
        "meta": os.path.join(root, "lab.json"),
        "pods": os.path.join(root, "state", "harness", "pods"),
    }


def has_exited(pid: int) -> bool:
    """Whether `pid` has ended: gone, or a zombie. A detached daemon's parent is pid 1, which
    may reap it only seconds later (kill(pid, 0) succeeds on a zombie until then)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            state = fh.read().rpartition(")")[2].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return True
    return state in ("Z", "X")


def daemon_pid(root: str, daemon: str) -> int | None:
    try:
        with open(os.path.join(root, f"{daemon}.pid")) as fh:
            pid = int(fh.read().strip())
    except (OSError, ValueError):
        return None
    return None if has_exited(pid) else pid


def run(cmd: list[str], root: str, what: str) -> str:
    env = dict(os.environ, OVS_RUNDIR=root, OVS_DBDIR=root, OVS_LOGDIR=root)
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=30, check=False)
    except FileNotFoundError:
        raise LabError(f"{what}: {cmd[0]} is not installed (apt-get install openvswitch-switch)") from None
    except subprocess.TimeoutExpired:
        raise LabError(f"{what}: {cmd[0]} did not finish within 30 s") from None
    if proc.returncode != 0:
        raise LabError(f"{what} failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout


def vsctl(root: str, *args: str) -> str:
    return run(["ovs-vsctl", f"--db=unix:{paths(root)['sock']}", "--timeout=10", *args],
                root, "ovs-vsctl " + " ".join(args))
