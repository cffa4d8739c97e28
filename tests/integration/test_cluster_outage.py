"""With etcd frozen and no agent, ADDs needing a block are separate exec'd processes: those
that queued for the network's claim while another claim found etcd unreachable fail at once,
instead of each spending its own etcdTimeout after the previous one's (ipam/outage.py)."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.etcdsupport import EtcdServer
from tests.polling import poll

pytestmark = pytest.mark.root

ADDS = 4
GAVE_UP = "made while this one waited"


def _holds_open(pid: int, path: Path) -> bool:
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == str(path):
                return True
        except OSError:
            continue
    return False


def test_exec_adds_queued_behind_a_claim_that_finds_etcd_frozen_all_fail_with_it(tmp_path: Path) -> None:
    server = EtcdServer(tmp_path / "etcd").start()
    assert server.proc is not None
    etcd_pid = server.proc.pid
    node_config = tmp_path / "tenantnet.yaml"
    node_config.write_text(f"stateDir: {tmp_path}/state\nlogFile: {tmp_path}/log/tn.log\nipamDataDirs: [{tmp_path}]\n"
                           "nodeName: node-x\n"
                           f"etcdEndpoints: [{server.endpoint}]\netcdPrefix: /tn-outage/\netcdTimeout: 1\n"
                           f"clusterPools: [10.93.0.0/16]\nagentSocket: {tmp_path}/nobody.sock\n")
    data_dir = tmp_path / "store"
    raw = {"cniVersion": "1.0.0", "name": "rail-9", "type": "tenantnet-ipam",
           "ipam": {"type": "tenantnet-ipam", "ranges": [[{"subnet": "10.93.0.0/24"}]],
                    "dataDir": str(data_dir), "cluster": {"blockSize": 27}}}
    # The test holds the network's ledger lock while the ADDs start, so that every one of
    # them is queued for it when the first claim meets the frozen etcd.
    lock_path = data_dir / "cluster" / "rail-9.blocks.lock"
    lock_path.parent.mkdir(parents=True, mode=0o700)
    lock_fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(lock_fd, fcntl.LOCK_EX)
    ipam_exe = Path(sys.executable).parent / "tenantnet-ipam"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        os.kill(etcd_pid, signal.SIGSTOP)  # connections are accepted, nothing is answered
        for i in range(ADDS):
            procs.append(subprocess.Popen(
                [str(ipam_exe)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                env={"PATH": os.environ["PATH"], "TENANTNET_CONFIG": str(node_config), "CNI_COMMAND": "ADD",
                     "CNI_CONTAINERID": f"outage{i}", "CNI_IFNAME": "net1", "CNI_NETNS": "/run/netns/x",
                     "CNI_PATH": "/usr/lib/cni"}))
        for p in procs:
            assert p.stdin is not None
            p.stdin.write(json.dumps(raw).encode())
            p.stdin.close()
            p.stdin = None
        assert poll(lambda: all(_holds_open(p.pid, lock_path) or p.poll() is not None for p in procs), 60)
        assert all(p.poll() is None for p in procs), [p.communicate() for p in procs if p.poll() is not None]
        started = time.monotonic()
        os.close(lock_fd)
        lock_fd = -1
        outs = []
        for p in procs:
            out, err = p.communicate(timeout=120)
            outs.append((p.returncode, time.monotonic() - started, json.loads(out), err.decode()))
    finally:
        if lock_fd >= 0:
            os.close(lock_fd)
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        os.kill(etcd_pid, signal.SIGCONT)
        server.remove()
    print("exit, seconds after the lock was free, code:",
          [(rc, round(t, 2), doc.get("code")) for rc, t, doc, _ in outs])
    assert all(doc.get("code") == 11 for _, _, doc, _ in outs), outs
    assert all(not err for _, _, _, err in outs), outs  # no traceback
    # One claim spent the deadline on etcd; every other one gave up when it did.
    gave_up = [doc["msg"] for _, _, doc, _ in outs if GAVE_UP in doc["msg"]]
    assert len(gave_up) == ADDS - 1, [doc["msg"] for _, _, doc, _ in outs]
