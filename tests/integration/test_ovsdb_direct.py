"""The OVSDB client (tenantnet/plugin/system/ovsdb.py: plain `transact` requests) against the
lab's real ovsdb-server, compared with what ovs-vsctl sees; and against sockets that are not
OVSDB."""

from __future__ import annotations

import json
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tenantnet.plugin.system import ovsdb

IDS = {ovsdb.OWNER_CONTAINER: "c-direct", ovsdb.OWNER_IFNAME: "net1", "tenantnet-network": "n1"}


def _name() -> str:
    return "tnd" + uuid.uuid4().hex[:8]


def _ids(lab: Any, table: str, name: str) -> dict[str, str]:
    out = json.loads(lab.vsctl("--format=json", "--columns=external_ids", "list", table, name))
    return dict(out["data"][0][0][1])


@pytest.fixture
def db(lab: Any) -> Iterator[ovsdb.Ovsdb]:
    handle = ovsdb.Ovsdb(lab.ovsdb, timeout=5)
    yield handle
    handle.close()


@pytest.fixture
def port_name(lab: Any) -> Iterator[str]:
    name = _name()
    yield name
    lab.vsctl("--if-exists", "del-port", name)


def test_add_port_writes_one_owned_port_with_vlan_mtu_and_identity(lab: Any, db: ovsdb.Ovsdb,
                                                                   port_name: str) -> None:
    assert db.bridge_exists(lab.bridge) and not db.bridge_exists("br-nowhere")
    db.add_port(ovsdb.PortSpec(bridge=lab.bridge, name=port_name, tag=100, trunks=[20, 10], mtu=1400,
                               external_ids=IDS))
    assert port_name in lab.vsctl("list-ports", lab.bridge).split()
    assert lab.vsctl("get", "Port", port_name, "tag").strip() == "100"
    assert lab.vsctl("get", "Port", port_name, "vlan_mode").strip() == "native-untagged"
    assert lab.vsctl("get", "Interface", port_name, "mtu_request").strip() == "1400"
    for table in ("Port", "Interface"):  # the ownership tag and the identity on both rows
        assert _ids(lab, table, port_name) == {ovsdb.OWNER_KEY: ovsdb.OWNER, **IDS}
    state = db.port(port_name)
    assert state is not None and state.owned and state.bridge == lab.bridge
    assert (state.tag, state.trunks, state.vlan_mode) == (100, [10, 20], "native-untagged")
    assert state.external_ids == {ovsdb.OWNER_KEY: ovsdb.OWNER, **IDS}
    assert db.bridge_of_interface(port_name) == lab.bridge and db.bridge_of_interface("nope0") is None
    assert db.port("tnnothere0") is None
    assert db.bridge_datapath(lab.bridge) == lab.vsctl("get", "Bridge", lab.bridge, "datapath_type").strip()
    lab.vsctl("set", "Open_vSwitch", ".", "other_config:tn-direct-test=1")
    try:
        assert db.other_config()["tn-direct-test"] == "1"
    finally:
        lab.vsctl("remove", "Open_vSwitch", ".", "other_config", "tn-direct-test")
    assert db.delete_port(port_name, owner=("c-direct", "net1")) is True
    assert port_name not in lab.vsctl("list-ports", lab.bridge).split()
    assert db.delete_port(port_name) is False  # gone: nothing to do, no error


def test_add_port_reuses_an_existing_port_and_merges_external_ids(lab: Any, db: ovsdb.Ovsdb,
                                                                  port_name: str) -> None:
    lab.vsctl("add-port", lab.bridge, port_name, "--", "set", "Port", port_name, "external_ids:keep=1")
    db.add_port(ovsdb.PortSpec(bridge=lab.bridge, name=port_name, tag=7, external_ids=IDS))
    assert lab.vsctl("list-ports", lab.bridge).split().count(port_name) == 1
    assert lab.vsctl("get", "Port", port_name, "tag").strip() == "7"
    assert _ids(lab, "Port", port_name) == {"keep": "1", ovsdb.OWNER_KEY: ovsdb.OWNER, **IDS}
    assert _ids(lab, "Interface", port_name) == {ovsdb.OWNER_KEY: ovsdb.OWNER, **IDS}


def test_missing_bridge_fails_and_writes_nothing(lab: Any, db: ovsdb.Ovsdb, port_name: str) -> None:
    with pytest.raises(ovsdb.BridgeNotFound, match="bridge 'br-nowhere' does not exist in OVSDB"):
        db.add_port(ovsdb.PortSpec(bridge="br-nowhere", name=port_name, external_ids=IDS))
    assert not lab.vsctl("--columns=name", "find", "Port", f"name={port_name}").strip()


def test_bridge_removed_between_read_and_write_fails_the_transaction(lab: Any, db: ovsdb.Ovsdb,
                                                                     port_name: str) -> None:
    bridge = "brd" + uuid.uuid4().hex[:6]
    lab.vsctl("add-br", bridge, "--", "set", "Bridge", bridge, "datapath_type=" +
              lab.vsctl("get", "Bridge", lab.bridge, "datapath_type").strip())
    real = db._rpc_ops
    removed = []

    def remove_bridge_first(what: str, ops: list[Any]) -> list[Any]:
        if any(op["op"] == "insert" for op in ops) and not removed:
            lab.vsctl("del-br", bridge)  # after add_port read the bridge, before it writes
            removed.append(True)
        return real(what, ops)

    db._rpc_ops = remove_bridge_first  # type: ignore[method-assign]
    try:
        with pytest.raises(ovsdb.BridgeNotFound):
            db.add_port(ovsdb.PortSpec(bridge=bridge, name=port_name, external_ids=IDS))
    finally:
        lab.vsctl("--if-exists", "del-br", bridge)
    assert removed and not lab.vsctl("--columns=name", "find", "Port", f"name={port_name}").strip()
    assert not lab.vsctl("--columns=name", "find", "Interface", f"name={port_name}").strip()


def test_a_port_not_ours_is_refused_and_left_alone(lab: Any, db: ovsdb.Ovsdb, port_name: str) -> None:
    lab.vsctl("add-port", lab.bridge, port_name)
    with pytest.raises(ovsdb.OvsdbFailure, match=f"port {port_name} exists but is not owned by tenantnet"):
        db.delete_port(port_name)
    assert port_name in lab.vsctl("list-ports", lab.bridge).split()


def test_another_attachments_port_is_left_alone(lab: Any, db: ovsdb.Ovsdb, port_name: str) -> None:
    db.add_port(ovsdb.PortSpec(bridge=lab.bridge, name=port_name, external_ids=IDS))
    assert db.delete_port(port_name, owner=("c-other", "net1")) is False
    assert port_name in lab.vsctl("list-ports", lab.bridge).split()


def test_a_port_that_changes_hands_during_delete_is_not_removed(lab: Any, db: ovsdb.Ovsdb,
                                                                port_name: str) -> None:
    db.add_port(ovsdb.PortSpec(bridge=lab.bridge, name=port_name, external_ids=IDS))
    real = db._rpc_ops
    handed = []

    def hand_over_first(what: str, ops: list[Any]) -> list[Any]:
        if ops[0]["op"] == "wait" and not handed:  # checked as ours, then re-assigned before the delete
            lab.vsctl("set", "Port", port_name, f"external_ids:{ovsdb.OWNER_CONTAINER}=c-new")
            handed.append(True)
        return real(what, ops)

    db._rpc_ops = hand_over_first  # type: ignore[method-assign]
    assert db.delete_port(port_name, owner=("c-direct", "net1")) is False
    assert handed and port_name in lab.vsctl("list-ports", lab.bridge).split()
    assert _ids(lab, "Port", port_name)[ovsdb.OWNER_CONTAINER] == "c-new"


def test_wait_vswitchd_returns_with_the_port_numbered(lab: Any, port_name: str) -> None:
    import subprocess

    subprocess.run(["ip", "link", "add", port_name, "type", "veth", "peer", "name", "tnp" + port_name[3:]],
                   check=True)  # a device for vswitchd to number
    db = ovsdb.Ovsdb(lab.ovsdb, timeout=5, wait_vswitchd=True)
    try:
        db.add_port(ovsdb.PortSpec(bridge=lab.bridge, name=port_name, external_ids=IDS))
        state = db.port(port_name)  # read at once: vswitchd has applied the transaction
        assert state is not None and isinstance(state.ofport, int) and state.ofport > 0
        assert db.delete_port(port_name, wait=True) is True
    finally:
        db.close()
        subprocess.run(["ip", "link", "delete", port_name], check=False)


def test_probe_passes_against_the_labs_ovsdb_and_leaves_the_shared_handle_alone(lab: Any) -> None:
    before = dict(ovsdb._connections)
    ovsdb.probe(lab.ovsdb, timeout=2)
    assert ovsdb._connections == before  # STATUS's check uses a client of its own


class Stub:
    """A unix socket that accepts and then never answers (or answers `reply` once)."""

    def __init__(self, reply: bytes | None = None) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="tnt-od-"))
        self.path = str(self.dir / "db.sock")
        self.reply = reply
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(self.path)
        self.sock.listen(4)
        self.conns: list[socket.socket] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            if self.reply is not None:
                conn.recv(65536)
                conn.sendall(self.reply)

    def close(self) -> None:
        self.sock.close()
        for conn in self.conns:
            conn.close()
        Path(self.path).unlink(missing_ok=True)
        self.dir.rmdir()


def test_a_silent_server_times_out_within_ovsdb_timeout_as_unavailable() -> None:
    stub = Stub()
    db = ovsdb.Ovsdb(f"unix:{stub.path}", timeout=0.5)
    try:
        start = time.monotonic()
        with pytest.raises(ovsdb.OvsdbUnavailable, match=r"did not answer within 0.5s \(ovsdbTimeout\)"):
            db.bridge_exists("br-lab")
        # Not before the time-out the message names; 15 s only rules out a hang (the stub
        # never answers): far from 0.5 s on any load (3 s was not).
        assert 0.4 < time.monotonic() - start < 15
    finally:
        db.close()
        stub.close()


@pytest.mark.parametrize("reply", [b"HTTP/1.1 400 Bad Request\r\n\r\n", b"[1, 2]", b'{"id": 0' + b" " * 100])
def test_a_server_that_is_not_ovsdb_is_unavailable_not_a_hang(reply: bytes) -> None:
    stub = Stub(reply)
    db = ovsdb.Ovsdb(f"unix:{stub.path}", timeout=1)
    try:
        start = time.monotonic()
        with pytest.raises(ovsdb.OvsdbUnavailable):
            db.port("tnx")
        # At worst the 1 s time-out (the unfinished reply); 15 s rules out a hang on any load.
        assert time.monotonic() - start < 15
    finally:
        db.close()
        stub.close()


def test_no_server_is_unavailable_with_the_endpoint_named(tmp_path: Path) -> None:
    db = ovsdb.Ovsdb(f"unix:{tmp_path}/nothing.sock", timeout=1)
    with pytest.raises(ovsdb.OvsdbUnavailable, match=f"cannot connect to OVSDB at unix:{tmp_path}/nothing.sock"):
        db.add_port(ovsdb.PortSpec(bridge="br-lab", name="tnx"))


def test_an_in_process_ovs_add_and_del_import_neither_pyroute2_nor_yaml(lab: Any, plugin: Any,
                                                                            netns_factory: Any,
                                                                            no_leftovers: None) -> None:
    import os
    import subprocess
    import sys

    ns = netns_factory()
    cid = uuid.uuid4().hex
    probe = (
        "import json, os, sys\n"
        "from tenantnet.entry import plugin\n"
        "code, out = plugin.run_in_process(os.environ, sys.stdin.buffer.read())\n"
        "heavy = sorted(m for m in ('pyroute2', 'yaml') if m in sys.modules)\n"
        "print(json.dumps({'code': code, 'out': out, 'heavy': heavy}))\n"
    )
    for verb in ("ADD", "DEL"):
        env = {**os.environ, **plugin.env(verb, cid, ns.path, "net1")}
        proc = subprocess.run([sys.executable, "-c", probe], input=json.dumps(plugin.conf()).encode(),
                              env=env, capture_output=True, check=True)
        got = json.loads(proc.stdout)
        assert got["code"] == 0 and got["heavy"] == [], (verb, got, proc.stderr)
        if verb == "ADD":
            port = json.loads(got["out"])["interfaces"][0]["name"]
            assert port in lab.vsctl("list-ports", lab.bridge).split()
    assert port not in lab.vsctl("list-ports", lab.bridge).split()
