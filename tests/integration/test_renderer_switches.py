"""The renderer's OVN logical switches (tenantnet/kube/nbswitches.py, driven by
tenantnet/kube/render.py) against a private NB ovsdb-server (tenantnet.lab.nbserver), checked
with ovn-nbctl: an overlay TenantNetwork's switch `tn-<name>.<segment>` with its tunnel key,
a foreign switch of that name left alone, an agent-made one adopted, deletion only of the
renderer's switches and only once their ports are gone, a new segment's switch, the NB away
and back; and a whole reconcile (a fake API server in memory: its NADs, its status)."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest

from tenantnet.kube import nbswitches
from tenantnet.kube.nbswitches import SwitchKeeper
from tenantnet.lab import nbserver

pytestmark = pytest.mark.usefixtures("ovn_installed")


@pytest.fixture
def server() -> Iterator[nbserver.NbServer]:
    s = nbserver.start()
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture
def keeper(server: nbserver.NbServer) -> Iterator[SwitchKeeper]:
    k = SwitchKeeper(server.endpoint, timeout=2.0)
    yield k
    k.close()


def switches(server: nbserver.NbServer, name: str) -> list[dict[str, Any]]:
    out = json.loads(server.nbctl("--format=json", "--columns=name,external_ids,other_config,ports",
                                  "find", "Logical_Switch", f"name={name}"))
    rows = []
    for r in out["data"]:
        row = dict(zip(out["headings"], r, strict=True))
        for col in ("external_ids", "other_config"):
            row[col] = dict(row[col][1])
        ports = row["ports"]
        row["ports"] = len(ports[1]) if ports[0] == "set" else 1
        rows.append(row)
    return rows


def test_an_overlay_networks_switch_gets_its_tunnel_key_once(server, keeper):
    got = keeper.sync({"blue": 100})
    assert got.created == ["tn-blue.100"] and not got.unreachable
    (row,) = switches(server, "tn-blue.100")
    assert row["other_config"] == {"requested-tnl-key": "100"}
    assert row["external_ids"] == {"tenantnet-owner": "tenantnet", "tenantnet-network": "blue",
                                   "tenantnet-switch": "tn-blue.100", "tenantnet-tenant-network": "blue"}
    st = got.statuses["blue"]
    assert (st.switch, st.tunnel_key, st.state) == ("tn-blue.100", 100, nbswitches.READY)
    again = keeper.sync({"blue": 100})
    assert (again.created, again.updated, again.deleted) == ([], [], [])
    assert len(switches(server, "tn-blue.100")) == 1


def test_a_switch_not_ours_with_the_same_name_is_left_alone(server, keeper):
    server.nbctl("ls-add", "tn-red.200", "--", "set", "Logical_Switch", "tn-red.200", "external_ids:owner=cms",
                 "other_config:requested-tnl-key=7")
    got = keeper.sync({"red": 200})
    assert got.created == [] and got.updated == []
    st = got.statuses["red"]
    assert st.state == nbswitches.NOT_OURS and "not tenantnet's" in st.message
    (row,) = switches(server, "tn-red.200")  # no twin made
    assert row["external_ids"] == {"owner": "cms"} and row["other_config"] == {"requested-tnl-key": "7"}
    # Not ours, so never deleted either, wanted or not.
    assert keeper.sync({}).deleted == [] and len(switches(server, "tn-red.200")) == 1


def test_a_switch_an_agent_made_first_is_adopted(server, keeper):
    # As the agent creates a missing switch: ours, without a key, without the renderer's mark.
    server.nbctl("ls-add", "tn-green.300", "--", "set", "Logical_Switch", "tn-green.300",
                 "external_ids:tenantnet-owner=tenantnet", "external_ids:tenantnet-network=green",
                 "other_config:mcast_snoop=true")
    server.nbctl("lsp-add", "tn-green.300", "pod-port")
    got = keeper.sync({"green": 300})
    assert got.updated == ["tn-green.300"] and got.created == []
    (row,) = switches(server, "tn-green.300")
    assert row["other_config"] == {"requested-tnl-key": "300", "mcast_snoop": "true"}
    assert row["external_ids"]["tenantnet-tenant-network"] == "green" and row["ports"] == 1


def test_a_gone_networks_switch_is_deleted_only_once_its_ports_are_gone(server, keeper):
    keeper.sync({"blue": 100, "teal": 101})
    server.nbctl("lsp-add", "tn-blue.100", "n1-port", "--", "lsp-add", "tn-blue.100", "n2-port")
    got = keeper.sync({"teal": 101})  # blue gone (or refused)
    assert got.deleted == [] and got.kept == {"tn-blue.100": 2}
    st = got.statuses["blue"]
    assert st.state == nbswitches.PORTS_REMAIN and "2 logical ports remain" in st.message
    assert switches(server, "tn-blue.100")[0]["ports"] == 2
    server.nbctl("lsp-del", "n1-port", "--", "lsp-del", "n2-port")
    assert keeper.sync({"teal": 101}).deleted == ["tn-blue.100"]
    assert switches(server, "tn-blue.100") == [] and len(switches(server, "tn-teal.101")) == 1


def test_only_the_renderers_switches_are_deleted(server, keeper):
    # A hand-written NAD's network: the agents' switch (ours, no TenantNetwork mark), empty.
    server.nbctl("ls-add", "tn-legacy", "--", "set", "Logical_Switch", "tn-legacy",
                 "external_ids:tenantnet-owner=tenantnet", "external_ids:tenantnet-network=legacy")
    server.nbctl("ls-add", "tn-cms.5")
    keeper.sync({"blue": 100})
    got = keeper.sync({})
    assert got.deleted == ["tn-blue.100"]
    assert len(switches(server, "tn-legacy")) == 1 and len(switches(server, "tn-cms.5")) == 1


def test_a_new_segment_is_a_new_switch_and_the_old_one_goes_when_empty(server, keeper):
    keeper.sync({"blue": 100})
    server.nbctl("lsp-add", "tn-blue.100", "old-port")
    got = keeper.sync({"blue": 102})
    assert got.created == ["tn-blue.102"] and got.kept == {"tn-blue.100": 1}
    st = got.statuses["blue"]
    assert (st.switch, st.tunnel_key, st.state) == ("tn-blue.102", 102, nbswitches.READY)
    assert "tn-blue.100 is no longer wanted but 1 logical ports remain" in st.message
    server.nbctl("lsp-del", "old-port")
    assert keeper.sync({"blue": 102}).deleted == ["tn-blue.100"]


def test_an_unreachable_nb_is_said_and_retried(server, keeper):
    server.stop(keep=True)
    try:
        got = keeper.sync({"blue": 100})
        assert got.unreachable and got.created == []
        st = got.statuses["blue"]
        assert st.state == nbswitches.UNREACHABLE and "unreachable" in st.message and st.tunnel_key == 100
    finally:
        server.restart()
    got = keeper.sync({"blue": 100})
    assert not got.unreachable and got.created == ["tn-blue.100"]


# ---- a whole reconcile: the renderer with a fake API server ----------------------------------------

class FakeApi:
    """The few calls the renderer makes, on dicts in memory."""

    def __init__(self, namespaces: dict[str, dict[str, str]], networks: list[dict[str, Any]]) -> None:
        self.namespaces = namespaces
        self.networks = {n["metadata"]["name"]: n for n in networks}
        self.nads: dict[tuple[str, str], dict[str, Any]] = {}

    def _kind(self, res: Any) -> str:
        return getattr(res, "__name__", type(res).__name__)

    def list(self, res: Any, **_: Any) -> list[dict[str, Any]]:
        kind = self._kind(res)
        if kind == "Namespace":
            return [{"metadata": {"name": n, "labels": lab}} for n, lab in self.namespaces.items()]
        if kind == "TenantNetwork":
            return copy.deepcopy(list(self.networks.values()))
        if kind == "NetworkAttachmentDefinition":
            return copy.deepcopy(list(self.nads.values()))
        return []

    def create(self, obj: Any, **_: Any) -> None:
        from tenantnet.kube import api

        body = api.as_dict(obj)
        self.nads[(body["metadata"]["namespace"], body["metadata"]["name"])] = body

    def patch(self, res: Any, name: str, body: dict[str, Any], namespace: str | None = None, **_: Any) -> None:
        if self._kind(res).endswith("Status"):
            status = self.networks[name].setdefault("status", {})
            for k, v in body["status"].items():
                if v is None:
                    status.pop(k, None)
                else:
                    status[k] = v
        elif "spec" in body:
            self.nads[(namespace or "", name)] = body

    def get(self, res: Any, name: str, namespace: str | None = None) -> dict[str, Any]:
        return self.nads[(namespace or "", name)]

    def delete(self, res: Any, name: str, namespace: str | None = None) -> None:
        del self.nads[(namespace or "", name)]


class Log:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def info(self, event: str, **kw: Any) -> None:
        self.events.append((event, kw))

    warning = info


def network(name: str, vlan: int, tenant: str, subnet: str) -> dict[str, Any]:
    return {"apiVersion": "tenantnet.io/v1alpha1", "kind": "TenantNetwork",
            "metadata": {"name": name, "uid": f"u-{name}", "generation": 1},
            "spec": {"tenants": [tenant], "fabric": {"mode": "ovs", "overlay": "geneve"}, "vlan": vlan,
                     "ipam": {"ranges": [[{"subnet": subnet}]]}}}


def test_the_renderer_keeps_switches_and_says_so_in_status(server):
    pytest.importorskip("lightkube")
    from tenantnet.kube.render import Renderer
    from tenantnet.plugin.tenants import TenantResolver

    fake = FakeApi({"team-a-ns": {"tenantnet.io/tenant": "team-a"}, "team-b-ns": {"tenantnet.io/tenant": "team-b"}},
                   [network("alpha", 500, "team-a", "10.50.0.0/24"), network("beta", 500, "team-b", "10.51.0.0/24")])
    log = Log()
    renderer = Renderer(fake, TenantResolver(("label",), ()), log, ovn_northbound=server.endpoint, ovn_timeout=2.0)
    try:
        out = renderer.reconcile()
        assert out.switches.created == ["tn-alpha.500"] and not out.errors, out.errors
        alpha, beta = fake.networks["alpha"]["status"], fake.networks["beta"]["status"]
        assert alpha["overlay"] == {"switch": "tn-alpha.500", "tunnelKey": 500, "state": "Ready",
                                    "message": "logical switch tn-alpha.500, tunnel key 500"}
        # beta wants alpha's segment: refused, no switch, no NAD.
        assert beta["conditions"][0]["reason"] == "Conflict" and "overlay" not in beta
        assert switches(server, "tn-beta.500") == [] and ("team-b-ns", "beta") not in fake.nads
        nad = json.loads(fake.nads[("team-a-ns", "alpha")]["spec"]["config"])
        assert nad["overlay"] == "geneve" and nad["vlan"] == 500 and "bridge" not in nad

        # The NB away: NADs still rendered (a new network's too), the status says it, a retry is due.
        fake.networks["gamma"] = network("gamma", 501, "team-b", "10.52.0.0/24")
        server.stop(keep=True)
        try:
            out = renderer.reconcile()
            assert renderer.nb_pending and any("OVN northbound" in e for e in out.errors)
            assert ("team-b-ns", "gamma") in fake.nads
            gamma = fake.networks["gamma"]["status"]
            assert gamma["overlay"]["state"] == "NbUnavailable" and gamma["overlay"]["switch"] == "tn-gamma.501"
            assert gamma["conditions"][0]["reason"] == "Rendered"
        finally:
            server.restart()
        out = renderer.reconcile()
        assert out.switches.created == ["tn-gamma.501"] and not renderer.nb_pending
        assert fake.networks["gamma"]["status"]["overlay"]["state"] == "Ready"

        # alpha deleted: its NAD goes, its switch too (no ports), beta now gets the segment.
        del fake.networks["alpha"]
        out = renderer.reconcile()
        assert "tn-alpha.500" in out.switches.deleted and switches(server, "tn-alpha.500") == []
        assert ("team-a-ns", "alpha") not in fake.nads
        assert fake.networks["beta"]["status"]["overlay"]["switch"] == "tn-beta.500"
        (row,) = switches(server, "tn-beta.500")
        assert row["other_config"] == {"requested-tnl-key": "500"}
        assert any(e == "render.switch_deleted" and kw["switch"] == "tn-alpha.500" for e, kw in log.events)
    finally:
        renderer.switches.close()
