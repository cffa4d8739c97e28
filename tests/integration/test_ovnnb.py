"""The OVN northbound client (tenantnet/plugin/system/ovnnb.py: ovsdbapp with a conditionally
monitored replica) against a private NB ovsdb-server (tenantnet.lab.nbserver), checked with
ovn-nbctl: ownership (others' ports untouched and refused), idempotent adds, port security,
GC, and the replica's bound with 2,000 ports of other nodes in the NB."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tenantnet.lab import nbserver
from tenantnet.plugin.system import ovnnb

pytestmark = pytest.mark.usefixtures("ovn_installed")

OTHERS = 2000


def _ids(container: str, ifname: str = "net1") -> dict[str, str]:
    return {ovnnb.OWNER_CONTAINER: container, ovnnb.OWNER_IFNAME: ifname}


@pytest.fixture(scope="module")
def server() -> Iterator[nbserver.NbServer]:
    """One NB for the module: tn-blue with OTHERS ports of other nodes (as their agents write
    them), 20 ports of another CMS on its own switch."""
    s = nbserver.start()
    try:
        nbserver.bulk_ports(s, "tn-blue", OTHERS)
        s.nbctl("ls-add", "cms-switch")
        for i in range(20):
            s.nbctl("lsp-add", "cms-switch", f"cms-{i}", "--", "set", "Logical_Switch_Port", f"cms-{i}",
                    "external_ids:owner=someone-else")
        yield s
    finally:
        s.stop()


@pytest.fixture
def agent(server: nbserver.NbServer, request: pytest.FixtureRequest) -> Iterator[ovnnb.OvnNb]:
    """An agent's handle: its node is unique per test, so tests do not see each other's ports."""
    nb = ovnnb.OvnNb(server.endpoint, ovnnb.Scope(node=f"n-{request.node.name[-40:]}"))
    nb.ensure_switch("blue")
    yield nb
    nb.gc(keep=())
    nb.close()


def _lsp(server: nbserver.NbServer, name: str) -> dict[str, object]:
    out = json.loads(server.nbctl("--format=json", "--columns=name,external_ids,addresses,port_security",
                                  "find", "Logical_Switch_Port", f"name={name}"))
    rows = [dict(zip(out["headings"], r, strict=True)) for r in out["data"]]
    assert len(rows) <= 1
    return rows[0] if rows else {}


def _switch_ports(server: nbserver.NbServer, switch: str) -> set[str]:
    """The names of the switch's ports (`lsp-list`: "<uuid> (<name>)" a line)."""
    return {line.split("(", 1)[1].rstrip(")") for line in server.nbctl("lsp-list", switch).splitlines()}


def _port_uuids(server: nbserver.NbServer, switch: str) -> list[str]:
    return sorted(server.nbctl("--bare", "--columns=ports", "list", "Logical_Switch", switch).split())


def test_replica_holds_only_this_nodes_ports(server: nbserver.NbServer, agent: ovnnb.OvnNb) -> None:
    # 2,000 ports of other nodes and 20 of another CMS are in the NB; the agent's replica has
    # none of them, and only tenantnet's switch.
    assert agent.replica_rows("Logical_Switch_Port") == 0
    assert agent.replica_rows("Logical_Switch") == 1
    agent.add_port("tn-blue", "mine-1", "0a:58:01:00:00:01", ["10.1.0.1/24"], _ids("c1"))
    assert agent.replica_rows("Logical_Switch_Port") == 1
    assert [p.name for p in agent.ports_of()] == ["mine-1"]
    # The renderer's scope (all of tenantnet's ports) sees the other nodes' too, not the CMS's.
    renderer = ovnnb.OvnNb(server.endpoint, ovnnb.Scope(node=None))
    try:
        assert renderer.replica_rows("Logical_Switch_Port") == OTHERS + 1
        assert len(renderer.ports_of(node="node-7")) == OTHERS // 100
    finally:
        renderer.close()


def test_add_is_one_port_with_port_security(server: nbserver.NbServer, agent: ovnnb.OvnNb) -> None:
    port = agent.add_port("tn-blue", "sec-1", "0A:58:01:00:00:02", ["10.1.0.2/24", "fd00::2/64"], _ids("c2"))
    expected = "0a:58:01:00:00:02 10.1.0.2 fd00::2"
    assert server.nbctl("lsp-get-port-security", "sec-1").strip() == expected
    assert server.nbctl("lsp-get-addresses", "sec-1").strip() == expected
    assert port.port_security == [expected] and port.addresses == [expected]
    assert "sec-1" in _switch_ports(server, "tn-blue")  # linked to the network's switch
    ids = dict(_lsp(server, "sec-1")["external_ids"][1])  # type: ignore[index]
    assert ids == {"tenantnet-owner": "tenantnet", "tenantnet-network": "blue", "tenantnet-switch": "tn-blue", "tenantnet-node": agent.scope.node,
                   "tenantnet-container-id": "c2", "tenantnet-ifname": "net1"}


def test_add_is_idempotent(server: nbserver.NbServer, agent: ovnnb.OvnNb) -> None:
    first = agent.add_port("tn-blue", "idem-1", "0a:58:01:00:00:03", ["10.1.0.3"], _ids("c3"))
    again = agent.add_port("tn-blue", "idem-1", "0a:58:01:00:00:03", ["10.1.0.3"], _ids("c3"))
    assert again == first
    assert len(_port_uuids(server, "tn-blue")) == OTHERS + 1
    # The same name for another attachment: refused, the port unchanged.
    with pytest.raises(ovnnb.PortInUse):
        agent.add_port("tn-blue", "idem-1", "0a:58:01:00:00:09", ["10.1.0.9"], _ids("c-other"))
    assert server.nbctl("lsp-get-addresses", "idem-1").strip() == "0a:58:01:00:00:03 10.1.0.3"
    # The same attachment again with another address (an ADD retried after its IPAM answered
    # anew): one port still, its addresses and port security now the new ones.
    moved = agent.add_port("tn-blue", "idem-1", "0a:58:01:00:00:03", ["10.1.0.4"], _ids("c3"))
    assert moved.addresses == moved.port_security == ["0a:58:01:00:00:03 10.1.0.4"]
    assert server.nbctl("lsp-get-port-security", "idem-1").strip() == "0a:58:01:00:00:03 10.1.0.4"
    assert len(_port_uuids(server, "tn-blue")) == OTHERS + 1


def test_foreign_port_of_the_same_name_is_refused_and_untouched(server: nbserver.NbServer,
                                                                agent: ovnnb.OvnNb) -> None:
    before = _lsp(server, "cms-3")
    with pytest.raises(ovnnb.PortNotOurs, match="not tenantnet's"):
        agent.add_port("tn-blue", "cms-3", "0a:58:01:00:00:04", ["10.1.0.4"], _ids("c4"))
    # Another node's tenantnet port: refused too, naming its node.
    with pytest.raises(ovnnb.PortNotOurs, match="node-5"):
        agent.add_port("tn-blue", "other-5", "0a:58:01:00:00:05", ["10.1.0.5"], _ids("c5"))
    assert agent.delete_port("cms-3") is False
    assert agent.delete_port("other-5") is False
    assert _lsp(server, "cms-3") == before
    assert _lsp(server, "other-5")
    assert "cms-3" in _switch_ports(server, "cms-switch")


def test_delete_only_the_attachments_port(server: nbserver.NbServer, agent: ovnnb.OvnNb) -> None:
    agent.add_port("tn-blue", "del-1", "0a:58:01:00:00:06", ["10.1.0.6"], _ids("c6"))
    assert agent.delete_port("del-1", ("c-someone-else", "net1")) is False
    assert _lsp(server, "del-1")
    assert agent.delete_port("del-1", ("c6", "net1")) is True
    assert _lsp(server, "del-1") == {}
    assert "del-1" not in _switch_ports(server, "tn-blue")
    assert agent.delete_port("del-1") is False
    assert agent.replica_rows() == 0


def test_gc_removes_only_our_ports_not_kept(server: nbserver.NbServer, agent: ovnnb.OvnNb) -> None:
    for i in range(3):
        agent.add_port("tn-blue", f"gc-{i}", f"0a:58:01:00:01:0{i}", [f"10.1.1.{i + 1}"], _ids(f"g{i}"))
    cms_before = _port_uuids(server, "cms-switch")
    assert agent.gc(keep={"gc-0", "cms-1", "other-1"}) == ["gc-1", "gc-2"]
    assert _lsp(server, "gc-0") and not _lsp(server, "gc-1") and not _lsp(server, "gc-2")
    assert len(_port_uuids(server, "tn-blue")) == OTHERS + 1  # the other nodes' all there
    assert _port_uuids(server, "cms-switch") == cms_before


def test_switch_tunnel_key_and_ownership(server: nbserver.NbServer, agent: ovnnb.OvnNb) -> None:
    assert agent.ensure_switch("red", 4242, {"tenantnet-tenant": "t1"}) == "tn-red"
    assert agent.ensure_switch("red", 4242, {"tenantnet-tenant": "t1"}) == "tn-red"  # idempotent
    assert server.nbctl("--bare", "--columns=_uuid", "find", "Logical_Switch", "name=tn-red").count("\n") == 1
    assert server.nbctl("get", "Logical_Switch", "tn-red", "other_config:requested-tnl-key").strip() == '"4242"'
    assert server.nbctl("get", "Logical_Switch", "tn-red", "external_ids:tenantnet-owner").strip() == "tenantnet"
    with pytest.raises(ovnnb.NbFailure, match="outside"):
        agent.ensure_switch("red", 1 << 24)
    # A switch of the name that is not ours: refused, not twinned.
    server.nbctl("ls-add", "tn-green")
    with pytest.raises(ovnnb.NbFailure, match="not tenantnet's"):
        agent.ensure_switch("green")
    assert server.nbctl("--bare", "--columns=_uuid", "find", "Logical_Switch", "name=tn-green").count("\n") == 1
    with pytest.raises(ovnnb.SwitchNotFound):
        agent.add_port("tn-green", "g-1", "0a:58:01:00:02:01", ["10.1.2.1"], _ids("g1"))
    # ... and so is a switch that does not exist; neither leaves the port row behind (an
    # unlinked Logical_Switch_Port is not kept at commit).
    with pytest.raises(ovnnb.SwitchNotFound):
        agent.add_port("tn-nowhere", "g-2", "0a:58:01:00:02:02", ["10.1.2.2"], _ids("g2"))
    for name in ("g-1", "g-2"):
        assert server.nbctl("--bare", "--columns=_uuid", "find", "Logical_Switch_Port", f"name={name}") == ""


def test_two_endpoints_in_one_process_have_two_connections(server: nbserver.NbServer) -> None:
    # ovsdbapp's Backend keeps its connection in a class attribute: without a class per
    # endpoint, the second handle would silently talk to the first server.
    other = nbserver.start()
    try:
        a = ovnnb.OvnNb(server.endpoint, ovnnb.Scope(node="two-a"))
        b = ovnnb.OvnNb(other.endpoint, ovnnb.Scope(node="two-b"))
        try:
            a.ensure_switch("only-a")
            b.ensure_switch("only-b")
            assert "tn-only-a" in server.nbctl("ls-list") and "tn-only-a" not in other.nbctl("ls-list")
            assert "tn-only-b" in other.nbctl("ls-list") and "tn-only-b" not in server.nbctl("ls-list")
        finally:
            a.close()
            b.close()
    finally:
        other.stop()


def test_unreachable_nb_is_named(tmp_path: object) -> None:
    nb = ovnnb.OvnNb(f"unix:{tmp_path}/absent.sock", ovnnb.Scope(node="x"), timeout=1)
    with pytest.raises(ovnnb.NbUnavailable, match="absent.sock"):
        nb.add_port("tn-blue", "p", "0a:58:00:00:00:01", ["10.0.0.1"], _ids("c"))


def test_reconnect_keeps_the_replica_bounded() -> None:
    # python-ovs re-sends the monitor with the conditions after a reconnect
    # (Idl.restart_fsm -> sync_conditions): still none of the other nodes' ports.
    server = nbserver.start()
    try:
        nbserver.bulk_ports(server, "tn-blue", 200)
        nb = ovnnb.OvnNb(server.endpoint, ovnnb.Scope(node="re"), timeout=20)
        try:
            nb.add_port("tn-blue", "re-1", "0a:58:01:00:03:01", ["10.1.3.1"], _ids("r1"))
            server.restart()
            nbserver.bulk_ports(server, "tn-blue", 100, prefix="later")
            # The first transaction after the restart waits for the reconnection.
            nb.add_port("tn-blue", "re-2", "0a:58:01:00:03:02", ["10.1.3.2"], _ids("r2"))
            assert [p.name for p in nb.ports_of()] == ["re-1", "re-2"]
            assert nb.replica_rows() == 2
        finally:
            nb.close()
    finally:
        server.stop()


def test_concurrent_adds_from_worker_threads(server: nbserver.NbServer, agent: ovnnb.OvnNb) -> None:
    # The agent's workers share the handle: ovsdbapp queues their transactions to its one
    # connection thread; every port lands once, each answered with its own row.
    from concurrent.futures import ThreadPoolExecutor

    def add(i: int) -> ovnnb.LogicalPort:
        return agent.add_port("tn-blue", f"conc-{i}", f"0a:58:01:00:04:{i:02x}", [f"10.1.4.{i + 1}"],
                              _ids(f"k{i}"))

    with ThreadPoolExecutor(8) as pool:
        ports = list(pool.map(add, range(40)))
    assert [p.name for p in ports] == [f"conc-{i}" for i in range(40)]
    assert [p.container_id for p in ports] == [f"k{i}" for i in range(40)]
    assert {p.name for p in agent.ports_of()} == {f"conc-{i}" for i in range(40)}
    assert len(_port_uuids(server, "tn-blue")) == OTHERS + 40


def test_agents_racing_to_make_one_switch_make_one(server: nbserver.NbServer) -> None:
    """Switch names are not unique in the NB schema: 6 agents (own connections) making the
    same network's switch at once leave exactly one (the create is conditional on no row of
    that name), and each of them then adds its port to that one."""
    import threading

    handles = [ovnnb.OvnNb(server.endpoint, ovnnb.Scope(node=f"race-{i}")) for i in range(6)]
    for nb in handles:
        nb.api()  # connected before the race, so the creates meet
    start = threading.Barrier(len(handles))
    errors: list[BaseException] = []

    def make(nb: ovnnb.OvnNb, i: int) -> None:
        try:
            start.wait()
            nb.ensure_switch("racing", segment=7, create_only=True)
            nb.add_port("tn-racing.7", f"race-port-{i}", f"0a:00:00:00:00:{i:02x}", [f"10.7.0.{i + 1}"],
                        _ids(f"race-c{i}"))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=make, args=(nb, i)) for i, nb in enumerate(handles)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not errors, errors
        rows = json.loads(server.nbctl("--format=json", "--columns=_uuid", "find", "Logical_Switch",
                                       "name=tn-racing.7"))["data"]
        assert len(rows) == 1
        assert _switch_ports(server, "tn-racing.7") == {f"race-port-{i}" for i in range(len(handles))}
    finally:
        for nb in handles:
            nb.gc(keep=())
            nb.close()
        server.nbctl("--if-exists", "ls-del", "tn-racing.7")
