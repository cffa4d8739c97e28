"""OVN's northbound database through ovsdbapp: one logical switch per tenant network, one
logical switch port per attachment, ownership recorded in `external_ids`, and a replica
bounded to what this process owns.

Ownership, as for the local OVSDB ports (tenantnet.plugin.system.ovsdb): every switch and
port we create carries `tenantnet-owner=tenantnet`; ports also carry the network, the node,
and the attachment (container id, ifname). We delete only rows that carry them, so a port
an operator or another CMS (OVN-Kubernetes, Neutron) made in the same NB is never touched.

Why a bounded replica: ovsdbapp is an IDL client, and by default the IDL monitors every
column of every row of every table it registered — with 10,000 logical ports of other nodes
in the NB, each agent would hold and keep updating all of them. python-ovs's IDL supports
OVSDB's conditional monitoring (RFC 7047 extension `monitor_cond`/`monitor_cond_since`;
`ovs.db.idl.Idl.cond_change`), and a condition set before the first connection is used in
the initial monitor request (`Idl.restart_fsm` -> `sync_conditions`: with no `last_id` the
latest conditions are requested and acked at once), so the other nodes' rows are never
sent. So a `Scope`:

- `Scope(node="n1")` (the agent): the Logical_Switch_Port rows whose external_ids include
  tenantnet-owner=tenantnet AND tenantnet-node=n1 — the node's own attachments only;
- `Scope(node=None)` (the renderer, cluster-wide): every port tenantnet owns;
- Logical_Switch: only our switches (tenantnet-owner=tenantnet), and without the `ports`
  column, which lists every port of the switch, every node's: it is registered write-only
  (python-ovs's `SchemaHelper.register_columns(..., readonly=[...])` leaves a column out of
  the monitor), and a port is linked or unlinked with a `mutate` on it (`Row.addvalue`,
  `Row.delvalue`), which needs no replica of the set;
- no other table is registered.

A consequence: a port the replica cannot see (a foreign one, or ours on another node) is
still guarded by the NB's unique index on Logical_Switch_Port.name — an insert of that name
fails in the server — and the refusal then reads the row once (a plain `select`) to say who
holds the name.

The ovsdbapp trap (CNI-FACTS §7): `ovsdbapp.backend.ovs_idl.Backend` keeps its connection in
a class attribute (`Backend._ovsdb_connection`, set once by the `ovsdb_connection` setter),
so a second API object — for another endpoint, or another scope of the same one — would
silently reuse the first connection (and closing one would close both): each handle gets a
subclass of its own (`_api_class`).

Errors: NbUnavailable (an OvsdbUnavailable: CNI code 11) for a server that cannot be reached
or does not answer in time; NbFailure (an OvsdbFailure: code 102) for a refused change, with
SwitchNotFound, PortNotOurs and PortInUse for the cases a caller tells apart.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from tenantnet.plugin.system.ovsdb import (
    OWNER,
    OWNER_CONTAINER,
    OWNER_IFNAME,
    OWNER_KEY,
    Ovsdb,
    OvsdbFailure,
    OvsdbUnavailable,
    WaitFailed,
)

DB = "OVN_Northbound"
OWNER_NETWORK = "tenantnet-network"
OWNER_NODE = "tenantnet-node"
OWNER_SWITCH = "tenantnet-switch"  # a port's switch (a network's segments are switches of their own)
# The TenantNetwork a switch serves: the renderer's mark (tenantnet/kube/nbswitches.py), also
# written by an agent that makes the switch first, so the renderer may retire it.
OWNER_TENANT_NETWORK = "tenantnet-tenant-network"
SWITCH_PREFIX = "tn-"
# OVN 23.03 ovn-nb(5): Logical_Switch other_config:requested-tnl-key, an integer in
# 1..16,777,215 that ovn-northd honours as the datapath's tunnel key (the Geneve VNI).
TNL_KEY = "requested-tnl-key"
MAX_TNL_KEY = (1 << 24) - 1
_LS = "Logical_Switch"
_LSP = "Logical_Switch_Port"
# What the agent and the renderer read of a switch; `ports` is written only (see the module).
_LS_COLUMNS = ["name", "other_config", "external_ids"]
_LSP_COLUMNS = ["name", "type", "addresses", "port_security", "up", "enabled", "external_ids"]


class NbUnavailable(OvsdbUnavailable):
    """The NB server cannot be reached, or did not answer in time."""


class NbNotConnected(NbUnavailable):
    """Nothing was sent: there is no connection to the NB (it could not be opened, or the
    replica's session is down). Unlike a transaction that timed out, which may have been
    committed, this one certainly changed nothing."""


class NbFailure(OvsdbFailure):
    """The NB answered but refused the change."""


class SwitchNotFound(NbFailure):
    pass


class PortNotOurs(NbFailure):
    """A logical switch port of that name exists and is not one of this scope's ports."""


class PortInUse(NbFailure):
    """A port of ours of that name serves another attachment."""


def switch_name(network: str, segment: int | None = None) -> str:
    """The logical switch of a network, or of one segment of it (`tn-<network>.<segment>`:
    under a tenancy policy one network carries each tenant's segment on a switch of its own;
    a TenantNetwork's segment is also the switch's tunnel key)."""
    return SWITCH_PREFIX + network + (f".{segment}" if segment is not None else "")


@dataclass(frozen=True)
class Scope:
    """The rows this process replicates: one node's ports (the agent) or all of tenantnet's
    (node None: the renderer)."""

    node: str | None = None

    def port_condition(self) -> list[Any]:
        owned = [["external_ids", "includes", ["map", [[OWNER_KEY, OWNER]]]]]
        if self.node is None:
            return owned
        # `includes` of a two-key map: both keys, with these values (a conjunction).
        return [["external_ids", "includes", ["map", [[OWNER_KEY, OWNER], [OWNER_NODE, self.node]]]]]

    def holds(self, ids: dict[str, str]) -> bool:
        """Whether a port with these external_ids is in the scope (as the condition says)."""
        return ids.get(OWNER_KEY) == OWNER and (self.node is None or ids.get(OWNER_NODE) == self.node)

    @staticmethod
    def switch_condition() -> list[Any]:
        return [["external_ids", "includes", ["map", [[OWNER_KEY, OWNER]]]]]


@dataclass(frozen=True)
class LogicalPort:
    """A logical switch port of ours, as the replica holds it."""

    name: str
    switch: str
    network: str
    node: str
    container_id: str
    ifname: str
    addresses: list[str]
    port_security: list[str]
    up: bool | None
    external_ids: dict[str, str] = field(default_factory=dict)


def _address(mac: str, ips: Iterable[str]) -> str:
    """OVN's "MAC IP..." form; the IPs without prefix length (port_security takes the same
    form, and then allows exactly these source addresses)."""
    return " ".join([mac.lower(), *(ip.split("/")[0] for ip in ips)])


def _not_ours_message(name: str, ids: dict[str, str]) -> str:
    if ids.get(OWNER_KEY) == OWNER:
        holder = f"tenantnet's port on node {ids.get(OWNER_NODE, '?')}"
    else:
        holder = f"not tenantnet's (external_ids:{OWNER_KEY} missing)"
    return f"a logical switch port named {name} exists in the NB and is {holder}; leaving it alone"


def _is_ours(ids: Any) -> bool:
    """A selected row's external_ids (OVSDB's ["map", pairs]) carry our ownership."""
    pairs = ids[1] if isinstance(ids, list) and len(ids) == 2 and ids[0] == "map" else []
    return [OWNER_KEY, OWNER] in pairs


def _opt(value: Any) -> Any:
    return value[0] if isinstance(value, list) and value else (None if isinstance(value, list) else value)


def _port(row: Any) -> LogicalPort:
    ids = dict(row.external_ids)
    network = ids.get(OWNER_NETWORK, "")
    return LogicalPort(
        name=row.name, switch=ids.get(OWNER_SWITCH) or (switch_name(network) if network else ""),
        network=network,
        node=ids.get(OWNER_NODE, ""), container_id=ids.get(OWNER_CONTAINER, ""),
        ifname=ids.get(OWNER_IFNAME, ""), addresses=list(row.addresses),
        port_security=list(row.port_security), up=_opt(row.up), external_ids=ids)


# ---- ovsdbapp commands: run inside the IDL transaction, re-run by ovsdbapp on TRY_AGAIN ------
# They are imported lazily (ovsdbapp costs ≈ 80 ms and ≈ 9 MB of imports; only the agent's OVN path and
# the renderer pay it).
def _commands() -> Any:
    from ovsdbapp.backend.ovs_idl import command, idlutils

    class AddPort(command.BaseCommand):  # type: ignore[misc]
        """Insert and link one port, unless this scope already holds it (answered as is)."""

        def __init__(self, api: Any, scope: Scope, switch: str, name: str, columns: dict[str, Any]) -> None:
            super().__init__(api)
            self.scope, self.switch, self.name, self.columns = scope, switch, name, columns

        def run_idl(self, txn: Any) -> None:
            existing = idlutils.row_by_value(self.api.idl, _LSP, "name", self.name, None)
            if existing is not None:
                ids = dict(existing.external_ids)
                if not self.scope.holds(ids):
                    # Only with a replica wider than the scope (a server without monitor_cond
                    # makes python-ovs fall back to an unconditional `monitor`).
                    raise PortNotOurs(_not_ours_message(self.name, ids))
                want = self.columns.get("external_ids", {})
                same = all(ids.get(k) == want.get(k) for k in (OWNER_CONTAINER, OWNER_IFNAME, OWNER_NETWORK))
                if same:
                    # This attachment's port from an earlier attempt: its addresses are this
                    # ADD's (a stale port security would drop the pod's traffic).
                    for column in ("addresses", "port_security"):
                        if list(getattr(existing, column)) != self.columns[column]:
                            setattr(existing, column, self.columns[column])
                self.result = existing  # checked by the caller: same attachment or PortInUse
                return
            ls = idlutils.row_by_value(self.api.idl, _LS, "name", self.switch, None)
            if ls is None:
                raise SwitchNotFound(f"logical switch {self.switch} is not one of tenantnet's in the NB")
            # The switch must still be there when the port is linked (it may be removed by
            # the renderer meanwhile): verify its name, so the server refuses a stale link.
            ls.verify("name")
            lsp = txn.insert(self.api.tables[_LSP])
            lsp.name = self.name
            for column, value in self.columns.items():
                setattr(lsp, column, value)
            ls.addvalue("ports", lsp)  # a mutate: the switch's port set is not replicated
            self.result = None

    class DeletePorts(command.BaseCommand):  # type: ignore[misc]
        """Unlink and delete ports of ours (LSPs are not root: unlinked, they would be
        collected anyway; deleting says what we mean)."""

        def __init__(self, api: Any, rows: list[tuple[Any, dict[str, str]]]) -> None:
            super().__init__(api)
            self.rows = rows

        def run_idl(self, txn: Any) -> None:
            done = []
            replica = self.api.tables[_LSP].rows
            for checked, ids in self.rows:
                # Re-read from the replica: on TRY_AGAIN ovsdbapp runs this again after the
                # update that invalidated the transaction.
                row = replica.get(checked.uuid)
                if row is None:
                    continue  # gone since it was read
                # Fail the transaction (ovsdbapp retries, re-reading) if the port changed
                # hands since its ownership was checked.
                row.verify("external_ids")
                if dict(row.external_ids) != ids:
                    continue
                name = row.name  # a deleted row can no longer be read
                ls = idlutils.row_by_value(self.api.idl, _LS, "name",
                                           ids.get(OWNER_SWITCH) or switch_name(ids.get(OWNER_NETWORK, "")),
                                           None)
                if ls is not None:
                    ls.delvalue("ports", row)
                row.delete()
                done.append(name)
            self.result = done

    return AddPort, DeletePorts


def _api_class() -> type:
    """An ovsdbapp API class of its own for each handle: the connection lives in a class
    attribute (see the module), so two handles sharing a class would share one connection —
    another endpoint's, or another scope's replica."""
    from ovsdbapp.schema.ovn_northbound import impl_idl

    return type("OvnNbApi", (impl_idl.OvnNbApiIdlImpl,), {"_ovsdb_connection": None})


class OvnNb:
    """One NB endpoint for one scope: a lazily opened ovsdbapp connection (its IDL thread
    keeps the bounded replica current), every change one transaction."""

    def __init__(self, endpoint: str, scope: Scope, timeout: float = 5.0) -> None:
        self.endpoint = endpoint
        self.scope = scope
        self.timeout = timeout
        self._api: Any = None
        self._lock = threading.Lock()

    # ---- the connection ----------------------------------------------------------------------
    def api(self) -> Any:
        with self._lock:
            if self._api is None:
                self._api = self._connect()
            return self._api

    def _connect(self) -> Any:
        from ovsdbapp import exceptions as ovsdbapp_exc
        from ovsdbapp.backend.ovs_idl import connection, idlutils

        try:
            helper = idlutils.get_schema_helper(self.endpoint, DB)
        except Exception as exc:  # python-ovs raises bare Exception for a missing server
            raise NbNotConnected(f"cannot reach the OVN northbound database at {self.endpoint}: "
                                 f"{exc}") from None
        # `ports` listed, and listed read-only: known to the IDL (so it can be mutated) but not
        # monitored (python-ovs Idl.__send_monitor_request skips `readonly` columns).
        helper.register_columns(_LS, [*_LS_COLUMNS, "ports"], readonly=["ports"])
        helper.register_columns(_LSP, _LSP_COLUMNS)
        idl = connection.OvsdbIdl(self.endpoint, helper, leader_only=False)
        # Before the first run(): the initial monitor request carries the conditions.
        idl.cond_change(_LS, Scope.switch_condition())
        idl.cond_change(_LSP, self.scope.port_condition())
        conn = connection.Connection(idl, timeout=self.timeout)
        cls = _api_class()
        try:
            return cls(conn)
        except ovsdbapp_exc.OvsdbConnectionUnavailable as exc:
            cls._ovsdb_connection = None  # type: ignore[attr-defined]
            raise NbNotConnected(f"cannot connect to the OVN northbound database at {self.endpoint}: "
                                 f"no answer within {self.timeout:g}s") from exc

    def close(self) -> None:
        with self._lock:
            api, self._api = self._api, None
        if api is not None:
            api.ovsdb_connection.stop(timeout=self.timeout)
            type(api)._ovsdb_connection = None

    def _commit(self, what: str, *commands: Any) -> list[Any]:
        from ovsdbapp import exceptions as ovsdbapp_exc

        api = self.api()
        # The session is down (the NB restarting): wait for the reconnection up to the
        # time-out, and if it does not come, fail having sent nothing — rather than send a
        # transaction that may time out after committing (a rollback could not know).
        # python-ovs's Idl has no public "connected now" (has_ever_connected stays true while
        # it reconnects); its jsonrpc Session has one.
        session = getattr(api.idl, "_session", None)
        if session is not None and not session.is_connected():
            deadline = time.monotonic() + self.timeout
            while not session.is_connected() and time.monotonic() < deadline:
                time.sleep(0.02)
            if not session.is_connected():
                raise NbNotConnected(f"{what}: the OVN northbound database at {self.endpoint} is not "
                                     f"connected (no reconnection within {self.timeout:g}s)")
        try:
            with api.transaction(check_error=True, log_errors=False) as txn:
                for c in commands:
                    txn.add(c)
        except NbFailure:
            raise
        except ovsdbapp_exc.TimeoutException:
            raise NbUnavailable(f"{what}: the OVN northbound database at {self.endpoint} did not "
                                f"answer within {self.timeout:g}s") from None
        except RuntimeError as exc:  # ovsdbapp's form of a refused transaction
            raise NbFailure(f"{what}: {exc}") from None
        return [c.result for c in commands]

    def replica_rows(self, table: str = _LSP) -> int:
        """How many rows of `table` this process holds (the bound the module argues)."""
        api = self.api()
        with api.ovsdb_connection.lock:
            return len(api.tables[table].rows)

    def _owned_rows(self) -> list[Any]:
        api = self.api()
        with api.ovsdb_connection.lock:
            return [r for r in api.tables[_LSP].rows.values() if self.scope.holds(r.external_ids)]

    # ---- switches ---------------------------------------------------------------------------
    def ensure_switch(self, network: str, tunnel_key: int | None = None,
                      external_ids: dict[str, str] | None = None, *, segment: int | None = None,
                      create_only: bool = False) -> str:
        """The logical switch of the network (its segment), created if missing; an existing
        one of ours gets the tunnel key and ids given, unless `create_only` (the agent: the
        renderer owns a TenantNetwork's switch and its key). A switch of that name that is
        not ours: NbFailure."""
        name = switch_name(network, segment)
        if tunnel_key is not None and not 1 <= tunnel_key <= MAX_TNL_KEY:
            raise NbFailure(f"network {network}: tunnel key {tunnel_key} is outside 1..{MAX_TNL_KEY}")
        ids = {**(external_ids or {}), OWNER_KEY: OWNER, OWNER_NETWORK: network, OWNER_SWITCH: name}
        other = {TNL_KEY: str(tunnel_key)} if tunnel_key is not None else {}
        row = self._switch_row(name)
        if row is None:
            self._refuse_foreign_switch(name)
            self._create_switch(name, ids, other)
            self._replicated_switch(name)
        elif not create_only:
            api = self.api()
            cmds = [api.db_set(_LS, row.uuid, ("external_ids", ids))]
            if other:
                cmds.append(api.db_set(_LS, row.uuid, ("other_config", other)))
            self._commit(f"updating logical switch {name}", *cmds)
        return name

    def _switch_row(self, name: str) -> Any:
        """The replica's logical switch named `name`, or None."""
        from ovsdbapp.backend.ovs_idl import idlutils

        api = self.api()
        with api.ovsdb_connection.lock:
            return idlutils.row_by_value(api.idl, _LS, "name", name, None)

    def _create_switch(self, name: str, ids: dict[str, str], other: dict[str, str]) -> None:
        """Insert the switch only while no switch of that name exists, in one transaction
        (a `wait` for no such row, then the insert): names are not unique in the NB schema,
        and two agents making the same network's switch at once would otherwise make twins,
        each with half of the network's ports. Losing that race is fine: the winner's switch
        is the one (checked to be ours)."""
        what = f"creating logical switch {name}"
        ops: list[dict[str, Any]] = [
            {"op": "wait", "table": _LS, "where": [["name", "==", name]], "columns": ["name"],
             "until": "==", "rows": [], "timeout": 0},
            {"op": "insert", "table": _LS, "row": {
                "name": name, "external_ids": ["map", sorted(ids.items())],
                "other_config": ["map", sorted(other.items())]}}]
        db = Ovsdb(self.endpoint, self.timeout)
        try:
            db._rpc_ops(what, ops, database=DB)
        except WaitFailed:  # made meanwhile: ours, or not?
            self._refuse_foreign_switch(name)
        except OvsdbUnavailable as exc:
            raise NbUnavailable(str(exc)) from None
        except OvsdbFailure as exc:
            raise NbFailure(str(exc)) from None
        finally:
            db.close()

    def _replicated_switch(self, name: str) -> None:
        """Until this handle's replica holds the switch `name` (made by the plain transaction
        above, or by another agent meanwhile): its update comes on ovsdbapp's own monitor, a
        moment after the write's reply, and a port is linked to the switch the replica holds
        (SwitchNotFound otherwise: seen with agents racing to make one switch)."""
        deadline = time.monotonic() + self.timeout
        while self._switch_row(name) is None:
            if time.monotonic() >= deadline:
                raise NbUnavailable(f"logical switch {name} was made, but this node's replica of the NB did "
                                    f"not show it within {self.timeout:g}s")
            time.sleep(0.001)

    def _refuse_foreign_switch(self, name: str) -> None:
        """Switch names are not unique in the NB schema: look (once, outside the replica)
        for a switch of that name that is not ours, rather than create a twin of it."""
        rows = self._select(f"looking up logical switch {name}",
                            {"op": "select", "table": _LS, "where": [["name", "==", name]],
                             "columns": ["external_ids"]})
        if any(not _is_ours(r.get("external_ids")) for r in rows):
            raise NbFailure(f"a logical switch named {name} exists in the NB and is not tenantnet's "
                            f"(external_ids:{OWNER_KEY} missing); leaving it alone")

    def _select(self, what: str, op: dict[str, Any]) -> list[dict[str, Any]]:
        """One `select` outside the replica, through the house's plain JSON-RPC client."""
        db = Ovsdb(self.endpoint, self.timeout)
        try:
            result = db._rpc_call(what, "transact", [DB, op])
        except OvsdbUnavailable as exc:
            raise NbUnavailable(str(exc)) from None
        finally:
            db.close()
        rows = result[0].get("rows") if isinstance(result, list) and result and isinstance(result[0], dict) \
            else None
        return rows if isinstance(rows, list) else []

    # ---- ports ------------------------------------------------------------------------------
    def add_port(self, switch: str, name: str, mac: str, ips: list[str],
                 external_ids: dict[str, str]) -> LogicalPort:
        """One logical switch port with addresses and port security "MAC IP..." (the pod
        can send from that MAC and those IPs only) and our ownership, in one transaction.
        Idempotent: a port of ours with this name and attachment is answered as is."""
        if self.scope.node is None and OWNER_NODE not in external_ids:
            raise NbFailure(f"logical port {name}: external_ids must name the node ({OWNER_NODE})")
        network = external_ids.get(OWNER_NETWORK) or (
            switch[len(SWITCH_PREFIX):] if switch.startswith(SWITCH_PREFIX) else switch)
        ids = {**external_ids, OWNER_KEY: OWNER, OWNER_NETWORK: network, OWNER_SWITCH: switch}
        if self.scope.node is not None:
            ids[OWNER_NODE] = self.scope.node
        address = _address(mac, ips)
        what = f"adding logical port {name} to {switch}"
        add_port, _ = _commands()
        api = self.api()
        try:
            (existing,) = self._commit(what, add_port(api, self.scope, switch, name, {
                "addresses": [address], "port_security": [address], "external_ids": ids}))
        except NbFailure as exc:
            if "constraint violation" in str(exc) or "identical values" in str(exc):
                raise self._not_ours(name) from None
            raise
        if existing is not None:
            with api.ovsdb_connection.lock:
                port = _port(existing)
            if (port.container_id, port.ifname, port.network) != (
                    ids.get(OWNER_CONTAINER), ids.get(OWNER_IFNAME), network):
                raise PortInUse(f"logical port {name} serves another attachment (container "
                                f"{port.container_id}, {port.ifname}, network {port.network})")
            return port
        with api.ovsdb_connection.lock:
            from ovsdbapp.backend.ovs_idl import idlutils
            row = idlutils.row_by_value(api.idl, _LSP, "name", name, None)
            if row is not None:
                return _port(row)
        # Committed, but the replica's update has not come (ovsdb-server sends it before the
        # reply, so this is not expected): answer what was written.
        return LogicalPort(name=name, switch=switch, network=network, node=ids.get(OWNER_NODE, ""),
                           container_id=ids.get(OWNER_CONTAINER, ""), ifname=ids.get(OWNER_IFNAME, ""),
                           addresses=[address], port_security=[address], up=None, external_ids=ids)

    def _not_ours(self, name: str) -> PortNotOurs:
        rows = self._select(f"looking up logical port {name}",
                            {"op": "select", "table": _LSP, "where": [["name", "==", name]],
                             "columns": ["external_ids"]})
        ids: dict[str, str] = {}
        if rows and isinstance(rows[0].get("external_ids"), list) and rows[0]["external_ids"][0] == "map":
            ids = {str(k): str(v) for k, v in rows[0]["external_ids"][1]}
        return PortNotOurs(_not_ours_message(name, ids))

    def delete_port(self, name: str, owner: tuple[str, str] | None = None) -> bool:
        """Delete the port if it is ours (in this scope) and, with `owner` (container id,
        ifname), still that attachment's. False when there is nothing of ours to delete: a
        foreign port of that name is outside the replica, and untouched."""
        api = self.api()
        for row in self._owned_rows():
            with api.ovsdb_connection.lock:
                if row.name != name:
                    continue
                ids = dict(row.external_ids)
            if owner is not None and (ids.get(OWNER_CONTAINER), ids.get(OWNER_IFNAME)) != owner:
                return False
            _, delete_ports = _commands()
            (done,) = self._commit(f"deleting logical port {name}", delete_ports(api, [(row, ids)]))
            return name in done
        return False

    def ports_of(self, network: str | None = None, node: str | None = None) -> list[LogicalPort]:
        """Our ports in the replica, of one network and/or node (the agent's replica holds its
        own node's only)."""
        api = self.api()
        rows = self._owned_rows()
        with api.ovsdb_connection.lock:
            ports = [_port(r) for r in rows]
        return sorted((p for p in ports if (network is None or p.network == network)
                       and (node is None or p.node == node)), key=lambda p: p.name)

    def gc(self, keep: Iterable[str]) -> list[str]:
        """Delete our ports (this scope's) whose names are not in `keep`; others' ports are
        outside the replica and never considered. One transaction."""
        kept = set(keep)
        api = self.api()
        rows = [r for r in self._owned_rows() if r.name not in kept]
        if not rows:
            return []
        with api.ovsdb_connection.lock:
            pairs = [(r, dict(r.external_ids)) for r in rows]
        _, delete_ports = _commands()
        (done,) = self._commit(f"collecting {len(pairs)} logical ports", delete_ports(api, pairs))
        return sorted(done)


_connections: dict[tuple[str, Scope], OvnNb] = {}
_connections_lock = threading.Lock()


def connect(endpoint: str, scope: Scope, timeout: float | None = None) -> OvnNb:
    """The process-wide handle for `endpoint` and `scope` (connects on first use)."""
    with _connections_lock:
        nb = _connections.get((endpoint, scope))
        if nb is None:
            nb = _connections[(endpoint, scope)] = OvnNb(endpoint, scope)
        if timeout is not None:
            nb.timeout = timeout
        return nb


def close_all() -> None:
    with _connections_lock:
        handles = list(_connections.values())
        _connections.clear()
    for nb in handles:
        nb.close()
