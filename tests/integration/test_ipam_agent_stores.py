"""A stream of tenant-chosen ipam.dataDirs through the agent (issue 26 #7): the agent's
descriptors stay bounded while the stores are open, and once they have held nothing for the
grace, a DEL removes them — no descriptor and no file left behind."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

from ipam import plugin
from tenantnet.plugin import nodeconfig
from tests.integration.conftest import Lab
from tests.integration.test_agent import agent_node_config, start_agent

IPAM_EXE = Path(sys.executable).parent / "tenantnet-ipam"
STORES = 3 * plugin.MAX_OPEN_STORES


def _call(node: Path, command: str, cid: str, data_dir: Path) -> dict[str, object] | None:
    raw = {"cniVersion": "1.0.0", "name": "fdtest", "type": "bridge",
           "ipam": {"type": "tenantnet-ipam", "ranges": [[{"subnet": "10.79.0.0/24"}]], "dataDir": str(data_dir)}}
    proc = subprocess.run([str(IPAM_EXE)], input=json.dumps(raw).encode(), capture_output=True, timeout=60,
                          env={"PATH": os.environ["PATH"], "TENANTNET_CONFIG": str(node), "CNI_COMMAND": command,
                               "CNI_CONTAINERID": cid, "CNI_IFNAME": "net1", "CNI_NETNS": "/run/netns/x",
                               "CNI_PATH": str(IPAM_EXE.parent)})
    assert proc.returncode == 0, (command, proc.stdout, proc.stderr)
    return json.loads(proc.stdout) if proc.stdout.strip() else None


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_a_stream_of_data_dirs_through_the_agent_leaves_nothing(lab: Lab, tmp_path: Path) -> None:
    node = agent_node_config(lab, tmp_path)
    state = Path(nodeconfig.load(str(node)).state_dir)
    base = lab.root / "ipam" / f"fdtest-{uuid.uuid4().hex[:8]}"
    agent = start_agent(node)
    try:
        pid = agent.proc.pid
        warm = base / "warm"
        _call(node, "ADD", "warm", warm)
        _call(node, "DEL", "warm", warm)
        before, served = _fds(pid), agent.served()
        for i in range(STORES):
            d = base / f"tenant-{i}"
            assert _call(node, "ADD", f"c{i}", d)
            _call(node, "DEL", f"c{i}", d)
        assert agent.served() - served == 2 * STORES  # the agent served them, not the exec'd plugin
        within_grace = _fds(pid) - before
        # the grace over: every empty mark made older, then DELs on the node sweep
        old = time.time() - plugin.EMPTY_GRACE_S - 1
        empty = state / "ipam-stores" / "empty"
        for mark in empty.iterdir():
            os.utime(mark, (old, old))
        for _ in range(STORES // 64 + 2):
            _call(node, "DEL", "nobody", warm)
        after = _fds(pid) - before
        left = sorted(p.name for p in base.iterdir()) if base.exists() else []
        print(f"agent descriptors: +{within_grace} within the grace ({STORES} stores), +{after} after; "
              f"left: {len(left)}")
        assert within_grace <= 4 * plugin.MAX_OPEN_STORES, within_grace
        assert after <= 0, after
        assert left == [], left[:5]
    finally:
        agent.stop()
        shutil.rmtree(base, ignore_errors=True)
