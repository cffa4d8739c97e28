"""Debian's Go `bridge` plugin with `tenantnet-ipam` as its IPAM: we are a drop-in IPAM.

The test creates its own netns and Linux bridge (random names) and removes both, also when
it fails; nothing else on the machine is touched.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ipam.sqlite_store import SqliteStore

IPAM = Path(sys.executable).parent / "tenantnet-ipam"
BRIDGE_PLUGIN = Path("/usr/lib/cni/bridge")

pytestmark = pytest.mark.root


def ip(*args: str, check: bool = True) -> str:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check).stdout


@pytest.fixture
def sandbox() -> Iterator[tuple[str, str]]:
    assert os.geteuid() == 0, "needs root (netns and a Linux bridge)"
    assert BRIDGE_PLUGIN.exists(), "Debian's containernetworking-plugins is not installed"
    assert IPAM.exists(), f"{IPAM} is missing: run .venv/bin/pip install -e '.[test]'"
    tag = uuid.uuid4().hex[:8]
    netns, bridge = f"tnipam-{tag}", f"tnib{tag}"
    ip("netns", "add", netns)
    try:
        yield netns, bridge
    finally:
        ip("netns", "del", netns, check=False)
        if ip("link", "show", bridge, check=False):
            ip("link", "del", bridge, check=False)


def call(command: str, config: dict[str, Any], netns: str) -> tuple[int, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CNI_")}
    # tenantnet-ipam honours only the dataDirs the node config allows: this test's own.
    data_dir = os.path.dirname(config["ipam"]["dataDir"])
    node = os.path.join(data_dir, "node.yaml")
    with open(node, "w") as fh:
        fh.write(f"ipamDataDirs: [{data_dir}]\nlogFile: {data_dir}/log/tenantnet.log\nstateDir: {data_dir}/state\n")
    env["TENANTNET_CONFIG"] = node
    env.update(CNI_COMMAND=command, CNI_CONTAINERID=f"ctr-{netns}", CNI_IFNAME="eth0",
               CNI_NETNS=f"/var/run/netns/{netns}",
               # the Go plugin finds its IPAM plugin on CNI_PATH, as libcni arranges
               CNI_PATH=f"{IPAM.parent}:/usr/lib/cni")
    with tempfile.TemporaryFile() as stdin:
        stdin.write(json.dumps(config).encode())
        stdin.seek(0)
        p = subprocess.run([str(BRIDGE_PLUGIN)], env=env, stdin=stdin, capture_output=True,
                           timeout=60, check=False)
    return p.returncode, json.loads(p.stdout) if p.stdout.strip() else None


def test_go_bridge_uses_tenantnet_ipam(tmp_path: Path, sandbox: tuple[str, str]) -> None:
    netns, bridge = sandbox
    config = {
        "cniVersion": "1.0.0", "name": "brnet", "type": "bridge", "bridge": bridge,
        "isGateway": True, "ipMasq": False,
        "ipam": {"type": "tenantnet-ipam", "dataDir": str(tmp_path / "store"),
                 "ranges": [[{"subnet": "10.243.17.0/24"}], [{"subnet": "fd00:243:17::/64"}]],
                 # an explicit gw: the Go bridge's CHECK looks for routes exactly as listed
                 "routes": [{"dst": "10.244.0.0/16", "gw": "10.243.17.1"}]},
    }
    rc, result = call("ADD", config, netns)
    assert rc == 0, result
    addrs = {i["address"] for i in result["ips"]}
    assert addrs == {"10.243.17.2/24", "fd00:243:17::2/64"}
    # the bridge plugin configured what we allocated, inside the netns, and our route
    inside = ip("-n", netns, "addr", "show", "dev", "eth0")
    assert "10.243.17.2/24" in inside and "fd00:243:17::2/64" in inside
    assert "10.244.0.0/16 via 10.243.17.1" in ip("-n", netns, "-4", "route")
    assert "10.243.17.1/24" in ip("addr", "show", "dev", bridge)  # isGateway: our gateway
    ping = subprocess.run(["ip", "netns", "exec", netns, "ping", "-c1", "-W2", "10.243.17.1"],
                          capture_output=True, text=True, check=False)
    assert ping.returncode == 0, ping.stdout + ping.stderr
    store = SqliteStore(str(tmp_path / "store"))
    try:
        held = store.allocations("brnet")
        assert {(str(a.address), a.container_id) for a in held} == {
            ("10.243.17.2", f"ctr-{netns}"), ("fd00:243:17::2", f"ctr-{netns}")}
        # CHECK runs through the bridge plugin into ours, with the prevResult
        rc, out = call("CHECK", dict(config, prevResult=result), netns)
        assert rc == 0, out
        rc, out = call("DEL", dict(config, prevResult=result), netns)
        assert rc == 0, out
        assert store.allocations("brnet") == []
        rc, out = call("DEL", config, netns)  # repeated DEL, no prevResult: still fine
        assert rc == 0, out
    finally:
        store.close()
