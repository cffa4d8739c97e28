"""Open vSwitch through OVSDB: one lazy connection per endpoint per process, only the
tables we need, one transaction per port, ownership recorded in `external_ids`.

Ports we create carry `tenantnet-owner=tenantnet` plus the attachment's identity on both
the Port and the Interface row; we only ever delete rows that carry it, so a port an
operator added by hand to the same bridge is never touched.

One module (≈ 460 lines) on purpose: the lazy connection, its error mapping and every
read and write share one replica and one lock; split, each half would reach into the
other's internals.
"""

from __future__ import annotations

import functools
import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

OWNER_KEY = "tenantnet-owner"
# The attachment a port of ours serves, in its external_ids (written by tenantnet.plugin.drivers.ovsport,
# checked by ownership-aware deletes).
OWNER_CONTAINER = "tenantnet-container-id"
OWNER_IFNAME = "tenantnet-ifname"
OWNER = "tenantnet"
# Only the columns we read or write: the replica then carries no statistics, whose updates
# ovs-vswitchd sends for every interface every few seconds (a burst of 1,000 ports made the
# whole-table replica a steady CPU load).
_COLUMNS = {
    "Open_vSwitch": ["bridges", "cur_cfg", "next_cfg", "other_config"],
    "Bridge": ["name", "ports", "datapath_type"],
    "Port": ["name", "interfaces", "tag", "trunks", "vlan_mode", "external_ids"],
    "Interface": ["name", "type", "ofport", "ofport_request", "mtu", "mtu_request", "error",
                  "external_ids"],
}


class OvsdbUnavailable(Exception):
    """The OVSDB server cannot be reached (socket missing, refused, time-out)."""


class OvsdbFailure(Exception):
    """OVSDB answered but the transaction failed."""


class BridgeNotFound(OvsdbFailure):
    pass


def _split(endpoint: str) -> tuple[str, str]:
    kind, _, rest = endpoint.partition(":")
    return kind, rest


def probe(endpoint: str, timeout: float = 1.0) -> None:
    """Fail fast (OvsdbUnavailable) unless an OVSDB server answers `list_dbs` there."""
    kind, rest = _split(endpoint)
    try:
        if kind == "unix":
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(timeout)
            sock.connect(rest)
        elif kind == "tcp":
            host, _, port = rest.rpartition(":")
            sock = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout)
        else:
            raise OvsdbUnavailable(f"OVSDB endpoint {endpoint}: only unix: and tcp: are supported")
    except OSError as exc:
        raise OvsdbUnavailable(f"cannot connect to OVSDB at {endpoint}: {exc.strerror or exc}") from None
    try:
        sock.sendall(json.dumps({"method": "list_dbs", "params": [], "id": 0}).encode())
        data = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
            try:
                reply = json.loads(data)
                break
            except ValueError:
                continue
        else:  # pragma: no cover - loop always breaks
            reply = None
        if not isinstance(reply, dict) or "Open_vSwitch" not in (reply.get("result") or []):
            raise OvsdbUnavailable(f"{endpoint} answered, but serves no Open_vSwitch database")
    except OSError as exc:
        raise OvsdbUnavailable(f"OVSDB at {endpoint} did not answer: {exc.strerror or exc}") from None
    finally:
        sock.close()


@dataclass
class PortState:
    name: str
    bridge: str | None
    tag: int | None
    trunks: list[int]
    vlan_mode: str | None
    external_ids: dict[str, str] = field(default_factory=dict)
    interface_type: str = ""
    ofport: int | None = None
    mtu: int | None = None
    error: str | None = None

    @property
    def owned(self) -> bool:
        return self.external_ids.get(OWNER_KEY) == OWNER


@dataclass
class PortSpec:
    """Everything one port gets, written in one transaction."""

    bridge: str
    name: str
    tag: int | None = None
    trunks: list[int] = field(default_factory=list)
    mtu: int | None = None
    ofport_request: int | None = None
    external_ids: dict[str, str] = field(default_factory=dict)


def _classify(what: str, exc: Exception) -> Exception:
    """A busy OVSDB (ovsdbapp's time-out, its full transaction queue) is worth a retry: code 11
    via OvsdbUnavailable; anything else is a failed transaction."""
    from ovsdbapp import exceptions as ovsdbapp_exceptions

    if isinstance(exc, ovsdbapp_exceptions.TimeoutException) or "TXN queue is full" in str(exc):
        return OvsdbUnavailable(f"{what}: OVSDB is busy: {exc}")
    if isinstance(exc, (OvsdbFailure, OvsdbUnavailable)):
        return exc
    return OvsdbFailure(f"{what}: {exc}")


def _opt(value: Any) -> Any:
    """OVSDB optional columns come back as [] or [x]."""
    if isinstance(value, list):
        return value[0] if value else None
    return value


def _owned(row: Any) -> bool:
    return bool(row.external_ids.get(OWNER_KEY) == OWNER)


_MAX_GROUP = 64  # changes per group transaction: bounds one transaction's size and time
_BURST_GAP = 0.01  # s: a change this soon after the previous one is part of a burst
_GATHER = 0.003  # s a burst's leader waits for more changes to join its transaction
_GATHER_ENOUGH = 16  # changes that end the gathering at once


@dataclass
class _Change:
    """One caller's commands waiting for, or done by, a group commit (Ovsdb._commit)."""

    what: str
    commands: tuple[Any, ...]
    wait: bool
    done: bool = False
    results: list[Any] = field(default_factory=list)
    next_cfg: int | None = None
    error: Exception | None = None


class Ovsdb:
    """One endpoint: a lazily started ovsdbapp connection whose replica holds only `_COLUMNS`.

    Reads come from the replica under the connection's lock (no round trip: the lock is the
    one ovsdbapp's own thread holds while it applies updates and runs transactions); writes
    are one transaction per port. With `wait_vswitchd` a port change also waits, on the
    caller's thread, until ovs-vswitchd has applied it (as `ovs-vsctl` without `--no-wait`);
    ovsdbapp's own vsctl transaction would wait on its connection thread and so hold up
    every other request of the agent behind one reconfiguration.
    """

    def __init__(self, endpoint: str, timeout: float = 5.0, wait_vswitchd: bool = False) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        self.wait_vswitchd = wait_vswitchd
        self._api: Any = None
        self._conn: Any = None
        self._lock = threading.Lock()
        # Group commit (see _commit): changes waiting for the transaction after the one in flight.
        self._group = threading.Condition(threading.Lock())
        self._queued: list[_Change] = []
        self._committing = False
        self._last_arrival = 0.0  # time.monotonic() of the latest change
        self._gathering = False  # a leader waits for arrivals (only then are they announced)

    @property
    def api(self) -> Any:
        with self._lock:
            if self._api is None:
                probe(self.endpoint, min(self.timeout, 2.0))
                from ovsdbapp.backend.ovs_idl import connection, idlutils
                from ovsdbapp.schema.open_vswitch import impl_idl

                from tenantnet.plugin.system import ovsjson

                ovsjson.install()  # ovs from PyPI parses JSON in pure Python: 5 ms per port
                try:
                    helper = idlutils.get_schema_helper(self.endpoint, "Open_vSwitch")
                    for table, columns in _COLUMNS.items():
                        helper.register_columns(table, columns)
                    idl = _ovsdbapp_classes().QuietIdl(self.endpoint, helper)
                    self._conn = connection.Connection(idl, timeout=self.timeout)
                    # ovsdbapp keeps the connection on the API *class* (the first one set
                    # wins), so a second endpoint in this process would silently use the
                    # first one's database: one subclass per endpoint.
                    api_class = type("OvsdbIdl", (impl_idl.OvsdbIdl,), {"_ovsdb_connection": None})
                    self._api = api_class(self._conn, start=True)
                except Exception as exc:
                    raise OvsdbUnavailable(f"cannot sync with OVSDB at {self.endpoint}: {exc}") from None
            return self._api

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                try:
                    self._conn.stop(timeout=1)
                except Exception:
                    pass
            self._api = self._conn = None

    @contextmanager
    def _replica(self, what: str) -> Iterator[dict[str, Any]]:
        """The replica's tables, consistent for the duration (ovsdbapp's thread waits)."""
        api = self.api
        with self._conn.lock:
            idl = api.idl
            # Between a lost connection and the next full sync the replica is an old snapshot:
            # answering from it could call a bridge missing (code 7) that is merely unseen.
            if not (idl._session.is_connected() and idl.state == idl.IDL_S_MONITORING):
                raise OvsdbUnavailable(f"{what}: the connection to OVSDB at {self.endpoint} is "
                                       "re-establishing; try again")
            try:
                yield api.idl.tables
            except (OvsdbFailure, OvsdbUnavailable):
                raise
            except Exception as exc:
                raise OvsdbFailure(f"{what}: {type(exc).__name__}: {exc}") from None

    def _commit(self, what: str, *commands: Any, wait: bool | None = None) -> list[Any]:
        """`commands` in one transaction (the results of each); with wait_vswitchd (or `wait`),
        return once vswitchd applied it.

        Group commit: changes made while another transaction of this handle is in flight are
        queued, and the next one commits all of them together. ovs-vswitchd reconfigures
        once per transaction it sees, at a cost that grows with the bridge's ports (the lab's
        userspace datapath: ≈ 37 ms of its CPU per port at 512 ports when each port is its
        own transaction, 3 ms when 16 share one), so a burst of attachments must not be a
        burst of transactions. A lone change commits at once: nothing waits for company.
        """
        change = _Change(what, commands, self.wait_vswitchd if wait is None else wait)
        with self._group:
            now = time.monotonic()
            in_burst, self._last_arrival = now - self._last_arrival < _BURST_GAP, now
            self._queued.append(change)
            if self._gathering:
                self._group.notify_all()  # the leader gathering company (below) counts arrivals
        while not change.done:
            with self._group:
                while not change.done and self._committing:
                    self._group.wait()
                if change.done:
                    break
                self._committing = True
                # In a burst (changes arriving milliseconds apart), gather company for a
                # moment: the port's transaction runs beside the ADD's IPAM and pod setup, so
                # the wait is mostly hidden, and it saves vswitchd a reconfiguration per port.
                # A change on its own (the previous one long ago) never waits.
                if in_burst:
                    until = time.monotonic() + _GATHER
                    self._gathering = True
                    while len(self._queued) < _GATHER_ENOUGH and (left := until - time.monotonic()) > 0:
                        self._group.wait(left)
                    self._gathering = False
                # Leader: the oldest queued changes (up to _MAX_GROUP) in one transaction.
                batch, self._queued = self._queued[:_MAX_GROUP], self._queued[_MAX_GROUP:]
            try:
                self._commit_group(batch)
            finally:
                with self._group:
                    self._committing = False
                    self._group.notify_all()
        if change.error is not None:
            raise change.error
        if change.next_cfg is not None:
            self._wait_applied(what, change.next_cfg)
        return change.results

    def _commit_group(self, batch: list[_Change]) -> None:
        """Commit `batch` as one transaction; if that fails, each change alone, so that one
        refused change (a port not ours, a bridge gone) fails only its own caller."""
        try:
            if len(batch) > 1:
                try:
                    results, next_cfg = self._transact([c for change in batch for c in change.commands],
                                                       any(change.wait for change in batch))
                except Exception:
                    pass  # retried one by one below, each with its own error
                else:
                    for change in batch:
                        n = len(change.commands)
                        change.results, results = results[:n], results[n:]
                        change.next_cfg = next_cfg if change.wait else None
                        change.done = True
                    return
            for change in batch:
                try:
                    change.results, change.next_cfg = self._transact(list(change.commands), change.wait)
                except Exception as exc:
                    change.error = _classify(change.what, exc)
                change.done = True
        finally:
            for change in batch:  # a BaseException above: never leave a caller waiting
                if not change.done:
                    change.error, change.done = OvsdbFailure(f"{change.what}: interrupted"), True

    def _transact(self, commands: list[Any], wait: bool) -> tuple[list[Any], int | None]:
        """One ovsdbapp transaction: (each command's result, the next_cfg to wait for)."""
        txn = _ovsdbapp_classes().PortTransaction(self.api, self._conn, self.timeout, check_error=True,
                                                  log_errors=False)
        txn.wait = wait
        for command in commands:
            txn.add(command)
        results = txn.commit()
        return list(results or [None] * len(commands)), txn.next_cfg

    def _wait_applied(self, what: str, next_cfg: int) -> None:
        """Until ovs-vswitchd reports cur_cfg >= next_cfg (it has reconfigured)."""
        deadline = time.monotonic() + self.timeout
        pause = 0.0005
        while True:
            with self._replica(what) as tables:
                rows = list(tables["Open_vSwitch"].rows.values())
                if rows and rows[0].cur_cfg >= next_cfg:
                    return
            if time.monotonic() > deadline:
                raise OvsdbUnavailable(f"{what}: ovs-vswitchd did not apply the change within "
                                       f"{self.timeout:g}s (ovsdbTimeout); is ovs-vswitchd running?")
            time.sleep(pause)
            pause = min(pause * 2, 0.01)

    # ---- queries (from the replica) ---------------------------------------------------
    def _named(self, table: str, name: str) -> Any:
        """The row of `table` called `name` (ovsdbapp's index on `name`), or None. Only
        inside `_replica`, which holds the lock the index is maintained under."""
        from ovsdbapp.backend.ovs_idl import idlutils

        return idlutils.row_by_value(self.api.idl, table, "name", name, None)

    def bridge_exists(self, bridge: str) -> bool:
        with self._replica(f"looking up bridge {bridge}"):
            return self._named("Bridge", bridge) is not None

    def bridge_datapath(self, bridge: str) -> str:
        with self._replica("reading bridge"):
            row = self._named("Bridge", bridge)
            return str(row.datapath_type) if row is not None else ""

    def port(self, name: str) -> PortState | None:
        with self._replica(f"reading port {name}") as tables:
            return self._port_state(tables, self._named("Port", name))

    def _port_state(self, tables: dict[str, Any], p: Any,
                    bridges: dict[Any, str] | None = None) -> PortState | None:
        if p is None:
            return None
        iface = next((i for i in p.interfaces if i.name == p.name), None)
        bridge = (bridges if bridges is not None else self._bridges_of_ports(tables)).get(p.uuid)
        return PortState(
            name=p.name,
            bridge=bridge,
            tag=_opt(p.tag),
            trunks=sorted(p.trunks),
            vlan_mode=_opt(p.vlan_mode),
            external_ids=dict(p.external_ids),
            interface_type=iface.type if iface is not None else "",
            ofport=_opt(iface.ofport) if iface is not None else None,
            mtu=_opt(iface.mtu) if iface is not None else None,
            error=_opt(iface.error) if iface is not None else None,
        )

    @staticmethod
    def _bridges_of_ports(tables: dict[str, Any]) -> dict[Any, str]:
        """Port row uuid -> bridge name (each bridge's port set read once)."""
        return {q.uuid: br.name for br in tables["Bridge"].rows.values() for q in br.ports}

    def bridge_of_interface(self, ifname: str) -> str | None:
        """The bridge holding a port with interface `ifname` (a plain port or a bond member)."""
        with self._replica("reading interfaces") as tables:
            for br in tables["Bridge"].rows.values():
                if any(i.name == ifname for p in br.ports for i in p.interfaces):
                    return str(br.name)
        return None

    def other_config(self) -> dict[str, str]:
        """The Open_vSwitch row's other_config (hw-offload, tc-policy, …)."""
        with self._replica("reading Open_vSwitch") as tables:
            rows = list(tables["Open_vSwitch"].rows.values())
            return dict(rows[0].other_config) if rows else {}

    def owned_ports(self) -> list[PortState]:
        """Every Port row carrying our ownership tag."""
        with self._replica("listing ports") as tables:
            bridges = self._bridges_of_ports(tables)
            return [state for p in tables["Port"].rows.values() if _owned(p)
                    if (state := self._port_state(tables, p, bridges)) is not None]

    # ---- changes --------------------------------------------------------------------
    def add_port(self, spec: PortSpec) -> None:
        """Create the port with VLAN, MTU and ownership in one transaction (never half-made)."""
        api = self.api
        if not self.bridge_exists(spec.bridge):
            raise BridgeNotFound(f"bridge {spec.bridge!r} does not exist in OVSDB at {self.endpoint}")
        ids = {OWNER_KEY: OWNER, **spec.external_ids}
        port_cols: list[tuple[str, Any]] = [("external_ids", ids)]
        if spec.tag is not None:
            port_cols.append(("tag", spec.tag))
        if spec.trunks:
            port_cols.append(("trunks", spec.trunks))
        if spec.tag is not None and spec.trunks:
            # ovs-cni semantics: untagged pod traffic belongs to `vlan`, tagged traffic
            # of the trunk VLANs passes as is.
            port_cols.append(("vlan_mode", "native-untagged"))
        iface_cols: list[tuple[str, Any]] = [("external_ids", ids)]
        if spec.mtu:
            iface_cols.append(("mtu_request", spec.mtu))
        if spec.ofport_request:
            iface_cols.append(("ofport_request", spec.ofport_request))
        self._commit(f"adding port {spec.name} to bridge {spec.bridge}",
                     api.add_port(spec.bridge, spec.name, may_exist=True),
                     api.db_set("Port", spec.name, *port_cols),
                     api.db_set("Interface", spec.name, *iface_cols))
        if self.wait_vswitchd:
            state = self.port(spec.name)
            if state is not None and (state.error or state.ofport == -1):
                raise OvsdbFailure(f"ovs-vswitchd could not add port {spec.name} to bridge "
                                   f"{spec.bridge}: {state.error or 'no OpenFlow port number'}")

    def set_port_tag(self, name: str, tag: int | None) -> None:
        """Set (None: clear) the access VLAN of an existing port, whoever owns it. Only the
        lab's emulated embedded switch uses this, on its own ports."""
        api = self.api
        command = api.db_set("Port", name, ("tag", tag)) if tag else api.db_clear("Port", name, "tag")
        self._commit(f"setting the VLAN of port {name}", command)

    def delete_port(self, name: str, owner: tuple[str, str] | None = None, *, wait: bool = False) -> bool:
        """Delete a port we own; False if absent. A port not ours is left alone, and with
        `owner` = (container id, ifname) so is one of ours whose external_ids name another
        attachment (a representor port now serving another pod).

        The ownership check runs inside the deleting transaction, so a port that changes
        hands in between is never removed. With `wait`, return once ovs-vswitchd has removed
        it from the datapath (a device it gave back is then left alone by vswitchd)."""
        delete = _ovsdbapp_classes().DeleteOwnedPort(self.api, name, owner)
        return bool(self._commit(f"deleting port {name}", delete, wait=wait or None)[0])




@functools.cache
def _ovsdbapp_classes() -> SimpleNamespace:
    """Our subclasses of ovsdbapp's, built once, on first use (ovsdbapp is a heavy import)."""
    from ovsdbapp.backend.ovs_idl import command, connection, idlutils, transaction

    class QuietIdl(connection.OvsdbIdl):  # type: ignore[misc]
        def cooperative_yield(self) -> None:
            # ovsdbapp sleeps(0) per updated row so that eventlet can switch; with real
            # threads that only hands the GIL away while its thread holds the replica lock,
            # and getting it back can take a switch interval (5 ms) per row under load.
            pass

    class PortTransaction(transaction.Transaction):  # type: ignore[misc]
        """What AddPortCommand expects of ovsdbapp's vsctl transaction, without its wait on
        the connection thread; with `wait` it bumps next_cfg the same way, and the caller
        waits for vswitchd on its own thread (Ovsdb._wait_applied)."""

        wait = False
        next_cfg: int | None = None

        def pre_commit(self, txn: Any) -> None:
            txn.expected_ifaces = set()
            if self.wait:
                self.api._ovs.increment("next_cfg")

        def post_commit(self, txn: Any) -> None:
            super().post_commit(txn)
            self.next_cfg = txn.get_increment_new_value() if self.wait else None

    class DeleteOwnedPort(command.BaseCommand):  # type: ignore[misc]
        def __init__(self, api: Any, name: str, owner: tuple[str, str] | None) -> None:
            super().__init__(api)
            self.name = name
            self.owner = owner

        def run_idl(self, txn: Any) -> None:
            port = idlutils.row_by_value(self.api.idl, "Port", "name", self.name, None)
            if port is None:
                self.result = False
                return
            if not _owned(port):
                raise OvsdbFailure(f"port {self.name} exists but is not owned by tenantnet "
                                   f"(external_ids:{OWNER_KEY} missing); leaving it alone")
            port.verify("external_ids")
            ids = port.external_ids
            if self.owner is not None and (ids.get(OWNER_CONTAINER), ids.get(OWNER_IFNAME)) != self.owner:
                self.result = False  # ours, but another attachment's now
                return
            # A "delete" mutation on every bridge (there are few): asking each bridge whether
            # it holds the port would turn its whole `ports` set into Row objects, a cost
            # that grows with the node's ports (≈ 1 ms per 100 here) on every DEL.
            for br in self.api._tables["Bridge"].rows.values():
                br.delvalue("ports", port)
            for iface in port.interfaces:
                iface.delete()
            port.delete()
            self.result = True

    return SimpleNamespace(QuietIdl=QuietIdl, PortTransaction=PortTransaction,
                           DeleteOwnedPort=DeleteOwnedPort)


_connections: dict[str, Ovsdb] = {}
# The agent's worker threads share the handles (ovsdbapp's Connection is thread-safe: one
# thread of its own runs the IDL, commands are queued to it); this lock only keeps two
# threads from creating two handles for one endpoint.
_connections_lock = threading.Lock()
# The class of the handles `connect` makes. A one-shot exec (the in-process fallback,
# tenantnet.entry.plugin.run_in_process) installs tenantnet.plugin.system.ovsdb_direct's,
# which speaks OVSDB's `transact` directly instead of syncing an ovsdbapp replica.
_handle_class: type[Ovsdb] = Ovsdb


def use_handle_class(cls: type[Ovsdb]) -> None:
    """Handles made by `connect` from now on are `cls` (an Ovsdb subclass)."""
    global _handle_class
    _handle_class = cls


def connect(endpoint: str, timeout: float | None = None, wait_vswitchd: bool | None = None) -> Ovsdb:
    """The process-wide handle for `endpoint` (connects on first use). Settings given here
    replace the handle's (the agent re-reads a changed node config); None keeps them."""
    with _connections_lock:
        db = _connections.get(endpoint)
        if db is None:
            db = _connections[endpoint] = _handle_class(endpoint)
        if timeout is not None:
            db.timeout = timeout
        if wait_vswitchd is not None:
            db.wait_vswitchd = wait_vswitchd
        return db


def close_all() -> None:
    with _connections_lock:
        dbs = list(_connections.values())
        _connections.clear()
    for db in dbs:
        db.close()
