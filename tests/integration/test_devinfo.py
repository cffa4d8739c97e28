"""Issue 26: device-info files belong to their attachment, their directory is made when a
reboot emptied it, and every refused ADD leaves its line in the node log.

- Only the name Multus derives for the attachment is accepted
  (`<deviceInfoDir>/<NAD namespace>-<NAD name>-<containerID>_<ifname>`); a NAD naming
  another pod's file, or the device plugin's, is refused with code 7 and the file is left
  byte for byte.
- tenantnet writes the file only where nothing is and removes only the file it wrote (its
  identity is in the record): Multus's copy of the device plugin's file is kept on ADD and
  on DEL.
- A missing deviceInfoDir (and parents) is created, never through a symlink.
- A refused ADD writes one `add.refused` line (code, msg, container id, ifname, network) in
  the node's JSON-lines log, in-process and through the agent.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import Lab, PluginRunner, new_cid
from tests.integration.test_agent import start_agent
from tests.integration.test_ovs_offload import conf_for, nic
from tests.integration.test_sriov import snapshot, vfconf, vfs
from tests.integration.test_trust_defects import assert_refused, invoke, node_settings, write_node

NS = "ns1"  # the K8S_POD_NAMESPACE the runners send
NAD = "vfnet"


def devdir(lab: Lab) -> Path:
    return Path(node_settings(lab)["deviceInfoDir"])


def multus_name(directory: Path, cid: str, ifname: str = "net1", nad: str = NAD, ns: str = NS) -> Path:
    """The file Multus names for an attachment (network-attachment-definition-client)."""
    return directory / f"{ns}-{nad}-{cid}_{ifname}"


def with_devinfo(lab: Lab, vf: dict[str, Any], path: Path | str) -> dict[str, Any]:
    return vfconf(lab, vf["address"], runtimeConfig={"CNIDeviceInfoFile": str(path)})


def vf_state_of(lab: Lab, vf: dict[str, Any]) -> Any:
    return snapshot(lab)[vf["address"]]


def records_of(lab: Lab, cid: str) -> list[Path]:
    return list((lab.state_dir / "attachments").rglob(f"{cid}/*.json"))


# ---- defect 2: another attachment's file ------------------------------------------------

def test_a_nad_naming_another_pods_device_info_file_is_refused(nic_lab, vfp, netns_factory):
    directory = devdir(nic_lab)
    vf_b, vf_a = vfs(nic_lab)[2], vfs(nic_lab)[3]
    ns_b, ns_a = netns_factory(), netns_factory()
    cid_b, cid_a = new_cid(), new_cid()
    file_b = multus_name(directory, cid_b)
    dp_dir = directory.parent / "dp"  # Multus's …/devinfo/cni beside the device plugin's …/devinfo/dp
    dp_dir.mkdir(parents=True, exist_ok=True)
    dp_file = dp_dir / f"example.com-rail-{vf_b['address']}-device.json"
    dp_bytes = b'{"type":"pci","version":"1.1.0","pci":{"pci-address":"dp-owned"}}'
    dp_file.write_bytes(dp_bytes)
    conf_b = with_devinfo(nic_lab, vf_b, file_b)
    try:
        assert vfp.add(conf_b, ns_b, cid_b).code == 0
        st = os.lstat(file_b)
        assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
        b_bytes = file_b.read_bytes()
        assert json.loads(b_bytes)["pci"]["pci-address"] == vf_b["address"]
        # Tenant A's NAD names pod B's file, the device plugin's file, or a name of its own
        # choosing that is not its attachment's: each refused before anything is touched.
        for target, word in ((file_b, cid_a), (dp_file, str(directory)), (multus_name(directory, cid_b, "net2"), cid_a),
                             (directory / f"x_{cid_a}_net1", cid_a)):
            conf_a = with_devinfo(nic_lab, vf_a, target)
            run = invoke(vfp, "ADD", conf_a, cid_a, ns_a.path)
            assert_refused(run, 7, "runtimeConfig.CNIDeviceInfoFile", word)
            assert records_of(nic_lab, cid_a) == []
            # the clean-up DEL a runtime sends after a failed ADD
            assert invoke(vfp, "DEL", conf_a, cid_a, ns_a.path).code == 0
            assert file_b.read_bytes() == b_bytes and dp_file.read_bytes() == dp_bytes
        assert not multus_name(directory, cid_b, "net2").exists()
        # B's own DEL still removes B's file (and leaves the device plugin's alone).
        assert vfp.call("DEL", conf_b, cid_b, ns_b.path).code == 0
        assert not file_b.exists()
        assert dp_file.read_bytes() == dp_bytes
    finally:
        file_b.unlink(missing_ok=True)
        dp_file.unlink(missing_ok=True)


def test_a_file_already_at_the_accepted_name_is_neither_replaced_nor_removed(nic_lab, vfp, netns_factory):
    """Multus copies the device plugin's file to the attachment's name before it calls the
    delegate: that file is not tenantnet's."""
    directory = devdir(nic_lab)
    directory.mkdir(parents=True, exist_ok=True)
    vf = vfs(nic_lab)[2]
    ns = netns_factory()
    cid = new_cid()
    path = multus_name(directory, cid)
    foreign = b'{"type":"pci","version":"1.1.0","pci":{"pci-address":"from-the-device-plugin"}}\n'
    path.write_bytes(foreign)
    os.chmod(path, 0o444)
    inode = os.lstat(path).st_ino
    conf = with_devinfo(nic_lab, vf, path)
    try:
        assert vfp.add(conf, ns, cid).code == 0
        assert path.read_bytes() == foreign and os.lstat(path).st_ino == inode
        assert not (directory / f".{path.name}.tenantnet").exists()
        assert vfp.call("DEL", conf, cid, ns.path).code == 0
        assert path.read_bytes() == foreign and os.lstat(path).st_ino == inode
    finally:
        path.unlink(missing_ok=True)


def test_a_file_put_in_place_of_ours_is_not_removed_on_del(nic_lab, vfp, netns_factory):
    directory = devdir(nic_lab)
    vf = vfs(nic_lab)[2]
    ns = netns_factory()
    cid = new_cid()
    path = multus_name(directory, cid)
    conf = with_devinfo(nic_lab, vf, path)
    try:
        assert vfp.add(conf, ns, cid).code == 0
        path.unlink()
        path.write_bytes(b"someone else's")
        assert vfp.call("DEL", conf, cid, ns.path).code == 0
        assert path.read_bytes() == b"someone else's"
    finally:
        path.unlink(missing_ok=True)


def test_a_retried_add_replaces_its_own_file(nic_lab, vfp, netns_factory):
    """A crash after the file was written: the retry (ADD again) takes its own file back."""
    directory = devdir(nic_lab)
    vf = vfs(nic_lab)[2]
    ns = netns_factory()
    cid = new_cid()
    path = multus_name(directory, cid)
    conf = with_devinfo(nic_lab, vf, path)
    try:
        crashed = invoke(vfp, "ADD", conf, cid, ns.path, TENANTNET_TEST_FAULT="add.devinfo-written")
        assert crashed.code != 0 and path.is_file()
        first = os.lstat(path).st_ino
        assert vfp.add(conf, ns, cid).code == 0
        assert path.is_file() and json.loads(path.read_text())["pci"]["pci-address"] == vf["address"]
        assert vfp.call("DEL", conf, cid, ns.path).code == 0
        assert not path.exists(), f"the retried ADD's file (first inode {first}) outlived the attachment"
        assert [p.name for p in directory.iterdir() if cid in p.name] == []
    finally:
        path.unlink(missing_ok=True)


def test_ovs_offload_writes_its_own_file_with_the_representor(switchdev_lab, off, netns_factory):
    directory = devdir(switchdev_lab)
    vf = nic(switchdev_lab)["vfs"][3]
    ns = netns_factory()
    cid = new_cid()
    path = multus_name(directory, cid, nad="offnet")
    conf = conf_for(switchdev_lab, vf, runtimeConfig={"CNIDeviceInfoFile": str(path)})
    try:
        inv = off.add(conf, ns, cid)
        assert inv.code == 0, inv.stdout
        pci = json.loads(path.read_text())["pci"]
        assert pci["pci-address"] == vf["address"] and pci["representor-device"] == vf["representor"]
        other = conf_for(switchdev_lab, vf, runtimeConfig={"CNIDeviceInfoFile": str(multus_name(directory, new_cid()))})
        assert_refused(invoke(off, "ADD", other, new_cid(), netns_factory().path), 7, "CNIDeviceInfoFile")
        assert off.call("DEL", conf, cid, ns.path).code == 0
        assert not path.exists()
    finally:
        path.unlink(missing_ok=True)


# ---- D1: deviceInfoDir emptied by a reboot ----------------------------------------------

def test_a_missing_device_info_dir_is_created(nic_lab, vfp, netns_factory, tmp_path):
    gone = tmp_path / "run" / "k8s.cni.cncf.io" / "devinfo" / "cni"  # nothing of it exists yet
    node = write_node(tmp_path / "node.yaml", nic_lab, deviceInfoDir=str(gone))
    vf = vfs(nic_lab)[2]
    ns = netns_factory()
    cid = new_cid()
    path = multus_name(gone, cid)
    conf = with_devinfo(nic_lab, vf, path)
    add = invoke(vfp, "ADD", conf, cid, ns.path, TENANTNET_CONFIG=str(node))
    try:
        assert add.code == 0, add.why()
        for level in (gone.parent.parent.parent, gone.parent.parent, gone.parent):
            st = os.lstat(level)
            assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o755, (level, oct(st.st_mode))
        st = os.lstat(gone)
        assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700, oct(st.st_mode)
        assert json.loads(path.read_text())["pci"]["pci-address"] == vf["address"]
    finally:
        deleted = invoke(vfp, "DEL", conf, cid, ns.path, TENANTNET_CONFIG=str(node))
        vfp.cleanups.clear()
    assert deleted.code == 0 and not path.exists()


def test_a_node_config_naming_multus_base_directory_uses_its_cni_folder(nic_lab, vfp, netns_factory, tmp_path):
    """deviceInfoDir …/devinfo (the default of earlier releases): Multus's names are in its
    cni/ folder, made if missing; the device plugin's dp/ beside it stays out of reach."""
    base = tmp_path / "devinfo"
    node = write_node(tmp_path / "node.yaml", nic_lab, deviceInfoDir=str(base))
    vf = vfs(nic_lab)[2]
    ns = netns_factory()
    cid = new_cid()
    path = multus_name(base / "cni", cid)
    conf = with_devinfo(nic_lab, vf, path)
    refused = invoke(vfp, "ADD", with_devinfo(nic_lab, vf, base / "dp" / path.name), new_cid(), ns.path,
                     TENANTNET_CONFIG=str(node))
    assert_refused(refused, 7, "runtimeConfig.CNIDeviceInfoFile")
    add = invoke(vfp, "ADD", conf, cid, ns.path, TENANTNET_CONFIG=str(node))
    try:
        assert add.code == 0, add.why()
        assert stat.S_IMODE(os.lstat(base).st_mode) == 0o755 and stat.S_IMODE(os.lstat(base / "cni").st_mode) == 0o700
        assert json.loads(path.read_text())["pci"]["pci-address"] == vf["address"]
        assert not (base / "dp").exists()
    finally:
        deleted = invoke(vfp, "DEL", conf, cid, ns.path, TENANTNET_CONFIG=str(node))
        vfp.cleanups.clear()
    assert deleted.code == 0 and not path.exists()


def test_a_symlink_in_place_of_the_device_info_folder_is_never_followed(nic_lab, vfp, netns_factory, tmp_path):
    (tmp_path / "devinfo").mkdir()
    directory = tmp_path / "devinfo" / "cni"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    directory.symlink_to(elsewhere, target_is_directory=True)
    node = write_node(tmp_path / "node.yaml", nic_lab, deviceInfoDir=str(directory))
    vf = vfs(nic_lab)[2]
    ns = netns_factory()
    cid = new_cid()
    conf = with_devinfo(nic_lab, vf, multus_name(directory, cid))
    before = vf_state_of(nic_lab, vf)
    run = invoke(vfp, "ADD", conf, cid, ns.path, TENANTNET_CONFIG=str(node))
    try:
        assert_refused(run, 5, str(directory), "a symlink is never followed")
        assert list(elsewhere.iterdir()) == []
        assert records_of(nic_lab, cid) == []
        assert vf_state_of(nic_lab, vf) == before
    finally:
        invoke(vfp, "DEL", conf, cid, ns.path, TENANTNET_CONFIG=str(node))
        vfp.cleanups.clear()


# ---- D4: every refused ADD has its line -------------------------------------------------

def refusals(lab: Lab, vf: dict[str, Any], directory: Path,
             log: Path) -> list[tuple[str, dict[str, str | None], bytes, int]]:
    """(label, env changes, stdin, CNI code) of refused ADDs of several kinds."""
    good = vfconf(lab, vf["address"])
    # a NAD sending its lines elsewhere, and only errors: its refusal is still in the node log
    quiet = {**good, "logFile": str(log.parent / "nad.log"), "logLevel": "error"}
    return [
        ("env", {"CNI_IFNAME": None}, json.dumps(good).encode(), 4),
        ("stdin", {}, b"{not json", 6),
        ("oversize", {}, b"{" + b" " * (1 << 20) + b"}", 6),  # refused by the shim itself
        ("field", {}, json.dumps({**good, "vlan": 5000}).encode(), 7),
        ("devinfo", {}, json.dumps(with_devinfo(lab, vf, directory / "ns9-other-abc_net1")).encode(), 7),
        ("logFile", {}, json.dumps({**good, "logFile": "/etc/tn-refused.log"}).encode(), 7),
        ("quiet-nad", {}, json.dumps({**quiet, "vlan": 5000}).encode(), 7),
    ]


def log_lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def check_refusals_logged(vfp: PluginRunner, lab: Lab, node: Path, log: Path, ns_path: str) -> None:
    vf = vfs(lab)[2]
    for label, changes, stdin, code in refusals(lab, vf, devdir(lab), log):
        cid = new_cid()
        before = len(log_lines(log))
        env = vfp.env("ADD", cid, ns_path, "net1")
        env["TENANTNET_CONFIG"] = str(node)
        for key, value in changes.items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
        got = vfp.raw(env, stdin)
        assert got.code == 1 and got.out is not None and got.out["code"] == code, (label, got.stdout, got.stderr)
        lines = [e for e in log_lines(log)[before:] if e.get("event") == "add.refused"]
        assert len(lines) == 1, (label, log_lines(log)[before:])
        line = lines[0]
        assert line["code"] == code and line["msg"] == got.out["msg"], (label, line)
        assert line["container_id"] == cid and line["level"] == "warning", (label, line)
        assert line["ifname"] == ("net1" if label != "env" else None), (label, line)
        assert line["network"] == (None if label in ("stdin", "oversize") else NAD), (label, line)


def test_refused_adds_are_logged_in_process(nic_lab, vfp, netns_factory, tmp_path):
    log = tmp_path / "log" / "tenantnet.log"
    node = write_node(tmp_path / "node.yaml", nic_lab, logFile=str(log),
                      agentSocket=str(tmp_path / "no-agent" / "agent.sock"))
    check_refusals_logged(vfp, nic_lab, node, log, netns_factory().path)


def test_refused_adds_are_logged_by_the_agent(nic_lab, vfp, netns_factory, agents):
    run_dir = Path(f"/tmp/tnd-{uuid.uuid4().hex[:8]}")  # a unix socket path stays short
    run_dir.mkdir()
    try:
        log = run_dir / "log" / "tenantnet.log"
        node = write_node(run_dir / "node.yaml", nic_lab, logFile=str(log),
                          agentSocket=str(run_dir / "sock" / "agent.sock"))
        agents.append(agent := start_agent(node))
        served = agent.served()
        check_refusals_logged(vfp, nic_lab, node, log, netns_factory().path)
        assert agent.served() > served  # they went through the agent, not in-process
    finally:
        for a in agents:
            a.stop()
        shutil.rmtree(run_dir, ignore_errors=True)


@pytest.mark.parametrize("kind", ["wrong-folder", "dotdot", "own-name-of-another-pod"])
def test_refusal_message_names_the_form(nic_lab, vfp, netns_factory, kind):
    directory = devdir(nic_lab)
    vf = vfs(nic_lab)[2]
    cid = new_cid()
    value = {"wrong-folder": str(directory.parent / f"{NS}-{NAD}-{cid}_net1"),
             "dotdot": f"{directory}/../{directory.name}/{NS}-{NAD}-{cid}_net1",
             "own-name-of-another-pod": str(multus_name(directory, new_cid()))}[kind]
    run = invoke(vfp, "ADD", with_devinfo(nic_lab, vf, value), cid, netns_factory().path)
    assert_refused(run, 7, "runtimeConfig.CNIDeviceInfoFile", str(directory))
    if kind == "own-name-of-another-pod":  # the message says which name this attachment has
        assert f"{directory}/<NAD namespace>-<NAD name>-{cid}_net1" in run.out["msg"], run.out["msg"]
