"""Open vSwitch through OVSDB: one lazy connection per endpoint per process, only the
tables we need, one transaction per port, ownership recorded in `external_ids`.

Ports we create carry `tenantnet-owner=tenantnet` plus the attachment's identity on both
the Port and the Interface row; we only ever delete rows that carry it, so a port an
operator added by hand to the same bridge is never touched.
"""

from __future__ import annotations

import json
import socket
import threading
from dataclasses import dataclass, field
from typing import Any

OWNER_KEY = "tenantnet-owner"
OWNER = "tenantnet"
_TABLES = ("Open_vSwitch", "Bridge", "Port", "Interface")


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
    return OvsdbFailure(f"{what}: {exc}")


def _opt(value: Any) -> Any:
    """OVSDB optional columns come back as [] or [x]."""
    if isinstance(value, list):
        return value[0] if value else None
    return value


class Ovsdb:
    def __init__(self, endpoint: str, timeout: float = 5.0) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        self._api: Any = None
        self._conn: Any = None
        self._lock = threading.Lock()

    @property
    def api(self) -> Any:
        with self._lock:
            if self._api is None:
                probe(self.endpoint, min(self.timeout, 2.0))
                from ovsdbapp.backend.ovs_idl import connection, idlutils
                from ovsdbapp.schema.open_vswitch import impl_idl

                try:
                    helper = idlutils.get_schema_helper(self.endpoint, "Open_vSwitch")
                    for table in _TABLES:
                        helper.register_table(table)
                    idl = connection.OvsdbIdl(self.endpoint, helper)
                    self._conn = connection.Connection(idl, timeout=self.timeout)
                    self._api = impl_idl.OvsdbIdl(self._conn, start=True)
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

    def _run(self, what: str, cmd: Any) -> Any:
        try:
            return cmd.execute(check_error=True)
        except OvsdbUnavailable:
            raise
        except Exception as exc:
            raise _classify(what, exc) from None

    # ---- queries --------------------------------------------------------------------
    def bridge_exists(self, bridge: str) -> bool:
        api = self.api
        return bool(self._run(f"looking up bridge {bridge}", api.br_exists(bridge)))

    def bridge_datapath(self, bridge: str) -> str:
        rows = self._run(
            "reading bridge", self.api.db_find("Bridge", ("name", "=", bridge), columns=["datapath_type"])
        )
        return rows[0]["datapath_type"] if rows else ""

    def port(self, name: str) -> PortState | None:
        api = self.api
        ports = self._run(
            f"reading port {name}",
            api.db_find("Port", ("name", "=", name),
                        columns=["_uuid", "name", "tag", "trunks", "vlan_mode", "external_ids"]),
        )
        if not ports:
            return None
        p = ports[0]
        ifaces = self._run(
            f"reading interface {name}",
            api.db_find("Interface", ("name", "=", name),
                        columns=["type", "ofport", "mtu", "error"]),
        )
        iface = ifaces[0] if ifaces else {}
        bridge = None
        for br in self._run("listing bridges", api.db_list("Bridge", columns=["name", "ports"])):
            if p["_uuid"] in br["ports"]:
                bridge = br["name"]
                break
        return PortState(
            name=name,
            bridge=bridge,
            tag=_opt(p["tag"]),
            trunks=sorted(p["trunks"]),
            vlan_mode=_opt(p["vlan_mode"]),
            external_ids=dict(p["external_ids"]),
            interface_type=iface.get("type", ""),
            ofport=_opt(iface.get("ofport")),
            mtu=_opt(iface.get("mtu")),
            error=_opt(iface.get("error")),
        )

    def bridge_of_interface(self, ifname: str) -> str | None:
        """The bridge holding a port with interface `ifname` (a plain port or a bond member)."""
        api = self.api
        ifaces = self._run("reading interfaces", api.db_find("Interface", ("name", "=", ifname),
                                                               columns=["_uuid"]))
        if not ifaces:
            return None
        uuid = ifaces[0]["_uuid"]
        ports = [p["_uuid"] for p in self._run("listing ports",
                                                api.db_list("Port", columns=["_uuid", "interfaces"]))
                 if uuid in p["interfaces"]]
        for br in self._run("listing bridges", api.db_list("Bridge", columns=["name", "ports"])):
            if any(p in br["ports"] for p in ports):
                return str(br["name"])
        return None

    def other_config(self) -> dict[str, str]:
        """The Open_vSwitch row's other_config (hw-offload, tc-policy, …)."""
        rows = self._run("reading Open_vSwitch", self.api.db_list("Open_vSwitch", columns=["other_config"]))
        return dict(rows[0]["other_config"]) if rows else {}

    def owned_ports(self) -> list[PortState]:
        """Every Port row carrying our ownership tag."""
        api = self.api
        rows = self._run("listing ports", api.db_list("Port", columns=["name", "external_ids"]))
        out = []
        for row in rows:
            if row["external_ids"].get(OWNER_KEY) != OWNER:
                continue
            state = self.port(row["name"])
            if state is not None:
                out.append(state)
        return out

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
        try:
            with api.transaction(check_error=True) as txn:
                txn.add(api.add_port(spec.bridge, spec.name, may_exist=True))
                txn.add(api.db_set("Port", spec.name, *port_cols))
                txn.add(api.db_set("Interface", spec.name, *iface_cols))
        except Exception as exc:
            raise _classify(f"adding port {spec.name} to bridge {spec.bridge}", exc) from None

    def delete_port(self, name: str) -> bool:
        """Delete a port we own; False if absent. A port not ours is left alone."""
        state = self.port(name)
        if state is None:
            return False
        if not state.owned:
            raise OvsdbFailure(
                f"port {name} exists but is not owned by tenantnet "
                f"(external_ids:{OWNER_KEY} missing); leaving it alone"
            )
        self._run(f"deleting port {name}", self.api.del_port(name, if_exists=True))
        return True


_connections: dict[str, Ovsdb] = {}
# The agent's worker threads share the handles (ovsdbapp's Connection is thread-safe: one
# thread of its own runs the IDL, commands are queued to it); this lock only keeps two
# threads from creating two handles for one endpoint.
_connections_lock = threading.Lock()


def connect(endpoint: str, timeout: float = 5.0) -> Ovsdb:
    """The process-wide handle for `endpoint` (connects on first use)."""
    with _connections_lock:
        db = _connections.get(endpoint)
        if db is None:
            db = _connections[endpoint] = Ovsdb(endpoint, timeout)
        return db


def close_all() -> None:
    with _connections_lock:
        dbs = list(_connections.values())
        _connections.clear()
    for db in dbs:
        db.close()
