"""A power cut under the agent: what the durability argument of docs/architecture.md relies
on, checked on a filesystem whose unwritten pages are really lost.

The agent's state (attachment records, the tenantnet-ipam store) lives on an ext4 image
mounted through a loop device with `commit=300`: nothing the kernel has not written out
reaches the image file for minutes, unless someone fsyncs. Copying the image file while it
is mounted is exactly what a power cut leaves on the disk (ext4 replays its journal when
the copy is mounted). The "reboot" then does what a real one does: the pods' namespaces
and veths are gone, OVS keeps its rows (with our external_ids), and the runtime DELs the
sandboxes it knew — or GCs them. Nothing of ours may remain, the store must be intact, and
new ADDs must work: records and IPAM need no fsync on the ADD/DEL path.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
from collections.abc import Iterator
from contextlib import closing
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import Lab, Netns, PluginRunner, new_cid
from tests.integration.test_agent import start_agent

IMAGE_MB = 64


class Disk:
    """An ext4 image mounted at `mnt` that keeps unsynced writes in memory (commit=300)."""

    def __init__(self, work: Path) -> None:
        self.image, self.mnt = work / "state.img", work / "mnt"
        self.mnt.mkdir()
        subprocess.run(["truncate", "-s", f"{IMAGE_MB}M", str(self.image)], check=True)
        subprocess.run(["mkfs.ext4", "-q", "-F", str(self.image)], check=True)
        self.mount(self.image)

    def mount(self, image: Path) -> None:
        subprocess.run(["mount", "-o", "loop,commit=300", str(image), str(self.mnt)], check=True)
        self.mounted = image

    def umount(self) -> None:
        subprocess.run(["umount", str(self.mnt)], check=True)

    def power_cut(self) -> Path:
        """The image as the disk holds it now (what survives a power cut); the live
        filesystem is then unmounted and the copy mounted in its place."""
        copy = self.image.with_name("after-cut.img")
        subprocess.run(["cp", "--sparse=always", str(self.image), str(copy)], check=True)
        self.umount()
        self.mount(copy)
        return copy


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Disk]:
    d = Disk(tmp_path)
    try:
        yield d
    finally:
        if subprocess.run(["umount", str(d.mnt)], capture_output=True, check=False).returncode:
            # Still busy (a process of a failed test holds a file there): detach it lazily,
            # so that the loop device goes as soon as the last user does.
            subprocess.run(["umount", "-l", str(d.mnt)], capture_output=True, check=False)


def _node_config(lab: Lab, disk: Disk, run: Path) -> Path:
    text = lab.node_config.read_text()
    lines = [line for line in text.splitlines()
             if not line.startswith(("stateDir:", "ipamDataDirs:", "ipamDataDir:"))]
    lines += [f"stateDir: {disk.mnt}/state", f"ipamDataDirs: [{disk.mnt}/ipam]", f"ipamDataDir: {disk.mnt}/ipam",
              f"agentSocket: {run}/sock/agent.sock"]
    path = run / "node.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _records(disk: Disk) -> list[Path]:
    return sorted(p for p in (disk.mnt / "state" / "attachments").rglob("*") if p.is_file())


def _allocations(disk: Disk) -> list[tuple[str, str]]:
    db = disk.mnt / "ipam" / "ipam.db"
    if not db.exists():
        return []
    with closing(sqlite3.connect(db)) as conn:  # closed: the filesystem is unmounted later
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        return [tuple(row) for row in conn.execute("SELECT address, container_id FROM allocation")]


def test_a_power_cut_loses_nothing_that_matters(lab: Lab, disk: Disk, tmp_path: Path,
                                                netns_factory: Any) -> None:
    run = tmp_path / "run"
    run.mkdir()
    node = _node_config(lab, disk, run)
    agent = start_agent(node)
    plugin = PluginRunner(replace(lab, node_config=node))
    conf = plugin.conf(name="powercut", ipam={"type": "tenantnet-ipam", "dataDir": f"{disk.mnt}/ipam",
                                               "ranges": [[{"subnet": "10.79.0.0/24"}]]})
    pods: list[tuple[str, Netns]] = []
    try:
        for _ in range(10):
            ns, cid = netns_factory(), new_cid()
            inv = plugin.add(conf, ns, cid)
            assert inv.code == 0, inv.stdout
            pods.append((cid, ns))
        for cid, ns in pods[:3]:  # answered DELs the cut may undo
            assert plugin.call("DEL", conf, cid, ns.path).code == 0
        before = len(_records(disk))
        assert before == 7 and len(_allocations(disk)) == 7
        ports = [p for p in lab.owned_ports() if p]
        assert len(ports) >= 7

        agent.kill()  # the power goes: the agent dies, and so does the page cache
        disk.power_cut()
        for _, ns in pods:  # the reboot: namespaces (and with them the veths) are gone
            subprocess.run(["ip", "netns", "delete", ns.name], check=False)
        lost = before - len(_records(disk))
        # The cut really dropped unsynced writes (otherwise this test would prove nothing).
        assert lost > 0, "every record survived the simulated power cut: the cut is not real"

        # After the reboot: a new agent; the runtime DELs the sandboxes it knew (netns
        # gone: CNI_NETNS empty) and GCs the network with nothing to keep.
        agent = start_agent(node)
        for cid, _ in pods[3:7]:
            inv = plugin.call("DEL", conf, cid, "")
            assert inv.code == 0, inv.stdout
        gc = {**conf, "cniVersion": "1.1.0", "cni.dev/valid-attachments": []}
        inv = plugin.raw(plugin.env("GC"), json.dumps(gc))
        assert inv.code == 0, inv.stdout
        assert [p for p in lab.owned_ports() if p in ports] == [], "OVS ports of dead pods left"
        assert _records(disk) == [], "records left"
        assert _allocations(disk) == [], "addresses left"

        # And the node works: fresh ADDs get distinct addresses from the intact store.
        fresh = [(new_cid(), netns_factory()) for _ in range(3)]
        got = []
        for cid, ns in fresh:
            inv = plugin.add(conf, ns, cid)
            assert inv.code == 0, inv.stdout
            got.append(inv.out["ips"][0]["address"])
        assert len(set(got)) == 3
        for cid, ns in fresh:
            assert plugin.call("DEL", conf, cid, ns.path).code == 0
        assert _records(disk) == [] and _allocations(disk) == []
    finally:
        agent.stop()
