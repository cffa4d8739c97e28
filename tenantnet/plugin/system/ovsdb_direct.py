"""OVSDB for a one-shot exec: the few requests of an in-process ADD/DEL/CHECK as plain
OVSDB JSON-RPC (RFC 7047 `transact`), with the standard library's `json` and `socket` only.

An exec'd plugin makes two or three OVSDB requests and exits. ovsdbapp would first cost
≈ 120 ms of imports (ovsdbapp, the `ovs` IDL), a schema fetch and a full sync of the
replica; `transact` needs none of it. `DirectOvsdb` is an `Ovsdb` whose port reads and
writes (`bridge_exists`, `bridge_datapath`, `port`, `bridge_of_interface`, `other_config`,
`add_port`, `delete_port`) are single `transact` requests on one unix (or tcp) connection;
every other method (GC's `owned_ports`, the lab's `set_port_tag`) still goes through the
ovsdbapp replica of the base class, started only if one of them is called.

`tenantnet.entry.plugin.run_in_process` calls `install()`, so `ovsdb.connect()` hands out
this class in a one-shot exec; the agent, which lives long and serves many requests, keeps
the ovsdbapp connection and its replica.

Same semantics as the base class:

- every row we create carries `tenantnet-owner=tenantnet` and the attachment's identity
  (Port and Interface), external_ids are merged as ovsdbapp's `db_set` merges them;
- `add_port` is one transaction (Interface + Port inserted with named uuids, the Bridge's
  `ports` mutated) guarded by `wait` operations: a bridge removed meanwhile fails it
  (BridgeNotFound), and an existing port of that name is reused with its columns set
  (ovsdbapp's `may_exist`);
- `delete_port` reads the port, checks ownership, and deletes in a transaction whose first
  operation `wait`s for the port's external_ids to be exactly what was checked: a port that
  changed hands in between is never removed (the read is repeated, as ovsdbapp retries a
  transaction whose `verify` failed);
- `wait_vswitchd`: the transaction increments `next_cfg`, then `cur_cfg` is polled;
- OvsdbUnavailable (code 11) for a server that is missing, refuses, is silent or is not an
  OVSDB server; OvsdbFailure (code 102) for a transaction that failed. Every request is
  bounded by the node's ovsdbTimeout and every reply by `MAX_REPLY` bytes.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any

from tenantnet.plugin.system import ovsdb
from tenantnet.plugin.system.ovsdb import (
    OWNER,
    OWNER_CONTAINER,
    OWNER_IFNAME,
    OWNER_KEY,
    BridgeNotFound,
    OvsdbFailure,
    OvsdbUnavailable,
    PortSpec,
    PortState,
)

DB = "Open_vSwitch"
MAX_REPLY = 16 << 20  # a reply to one of our requests is a few kB; this bounds a hostile peer
ATTEMPTS = 5  # transactions whose `wait` found the rows changed since they were read
_decoder = json.JSONDecoder()


def install() -> None:
    """Make `ovsdb.connect()` hand out `DirectOvsdb` handles (a one-shot exec)."""
    ovsdb.use_handle_class(DirectOvsdb)


# ---- OVSDB's JSON value notation (RFC 7047 5.1) ---------------------------------------------
def _atom(value: Any) -> Any:
    if isinstance(value, list) and len(value) == 2 and value[0] in ("uuid", "named-uuid"):
        return str(value[1])
    return value


def _set(value: Any) -> list[Any]:
    """A set column as a list (a one-element set may come as the bare atom)."""
    if isinstance(value, list) and len(value) == 2 and value[0] == "set":
        return [_atom(v) for v in value[1]]
    return [_atom(value)]


def _opt(value: Any) -> Any:
    """An optional column (a set of at most one): the value or None."""
    items = _set(value)
    return items[0] if items else None


def _map(value: Any) -> dict[Any, Any]:
    if isinstance(value, list) and len(value) == 2 and value[0] == "map":
        return {_atom(k): _atom(v) for k, v in value[1]}
    return {}


def _omap(ids: dict[str, str]) -> list[Any]:
    return ["map", [[k, v] for k, v in ids.items()]]


def _oset(items: list[Any]) -> list[Any]:
    return ["set", items]


def _uuid(value: str) -> list[str]:
    return ["uuid", value]


def _where_name(name: str) -> list[Any]:
    return [["name", "==", name]]


def _where_uuid(value: str) -> list[Any]:
    return [["_uuid", "==", _uuid(value)]]


def _holding(column: str, uuid: str) -> list[Any]:
    """`where`: the rows whose set `column` includes the row `uuid`."""
    return [[column, "includes", _oset([_uuid(uuid)])]]


def _mutate(table: str, where: list[Any], mutations: list[Any]) -> dict[str, Any]:
    return {"op": "mutate", "table": table, "where": where, "mutations": mutations}


def _select(table: str, where: list[Any], columns: list[str]) -> dict[str, Any]:
    return {"op": "select", "table": table, "where": where, "columns": columns}


def _wait(table: str, where: list[Any], columns: list[str], until: str, rows: list[Any]) -> dict[str, Any]:
    return {"op": "wait", "table": table, "where": where, "columns": columns, "until": until,
            "rows": rows, "timeout": 0}


class _Retry(Exception):
    """A guarding `wait` found the rows changed since they were read: read again."""


class DirectOvsdb(ovsdb.Ovsdb):
    """`Ovsdb` with port reads and writes as single `transact` requests (see the module)."""

    def __init__(self, endpoint: str, timeout: float = 5.0, wait_vswitchd: bool = False) -> None:
        super().__init__(endpoint, timeout, wait_vswitchd)
        self._sock: socket.socket | None = None
        self._buf = b""
        self._next_id = 0
        # The port transaction of an ADD runs on a helper thread (drivers/ovs.py): one
        # request at a time on the one connection.
        self._io = threading.Lock()

    # ---- the connection ------------------------------------------------------------------
    def close(self) -> None:
        with self._io:
            self._rpc_drop()
        super().close()

    def _rpc_drop(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
        self._sock, self._buf = None, b""

    def _rpc_connect(self, deadline: float) -> socket.socket:
        if self._sock is not None:
            return self._sock
        kind, rest = ovsdb._split(self.endpoint)
        try:
            if kind == "unix":
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    sock.settimeout(max(deadline - time.monotonic(), 0.001))
                    sock.connect(rest)
                except BaseException:
                    sock.close()
                    raise
            elif kind == "tcp":
                host, _, port = rest.rpartition(":")
                sock = socket.create_connection((host.strip("[]"), int(port)),
                                                timeout=max(deadline - time.monotonic(), 0.001))
            else:
                raise OvsdbUnavailable(f"OVSDB endpoint {self.endpoint}: only unix: and tcp: are supported")
        except TimeoutError:
            raise OvsdbUnavailable(f"cannot connect to OVSDB at {self.endpoint}: no answer within "
                                   f"{self.timeout:g}s (ovsdbTimeout)") from None
        except (OSError, ValueError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            raise OvsdbUnavailable(f"cannot connect to OVSDB at {self.endpoint}: {reason}") from None
        self._sock, self._buf = sock, b""
        return sock

    def _rpc_call(self, what: str, method: str, params: list[Any]) -> Any:
        """One JSON-RPC request and its reply's `result`, within the node's ovsdbTimeout."""
        with self._io:
            deadline = time.monotonic() + self.timeout
            try:
                sock = self._rpc_connect(deadline)
                self._next_id += 1
                ident = self._next_id
                sock.settimeout(max(deadline - time.monotonic(), 0.001))
                sock.sendall(json.dumps({"method": method, "params": params, "id": ident},
                                        separators=(",", ":")).encode())
                while True:
                    message = self._rpc_receive(sock, deadline)
                    if message.get("method") == "echo" and "id" in message:  # the server's keepalive
                        sock.sendall(json.dumps({"result": message.get("params", []), "error": None,
                                                 "id": message["id"]}).encode())
                        continue
                    if message.get("id") == ident and "result" in message:
                        break
                    # A notification or a stale reply: not ours.
            except TimeoutError:
                self._rpc_drop()
                raise OvsdbUnavailable(f"{what}: OVSDB at {self.endpoint} did not answer within "
                                       f"{self.timeout:g}s (ovsdbTimeout)") from None
            except OSError as exc:
                self._rpc_drop()
                raise OvsdbUnavailable(f"{what}: OVSDB at {self.endpoint} did not answer: "
                                       f"{exc.strerror or exc}") from None
            except OvsdbUnavailable:
                self._rpc_drop()
                raise
        if message.get("error") is not None:
            raise OvsdbFailure(f"{what}: OVSDB refused the request: {message['error']}")
        return message["result"]

    def _rpc_receive(self, sock: socket.socket, deadline: float) -> dict[str, Any]:
        """The next JSON-RPC message (at most MAX_REPLY bytes)."""
        while True:
            data = self._buf.lstrip()
            if data and data[:1] != b"{":
                raise OvsdbUnavailable(f"{self.endpoint} answered, but not as an OVSDB server")
            if data.endswith(b"}"):  # perhaps a whole message (only then worth decoding)
                try:
                    text = data.decode("utf-8")
                except UnicodeDecodeError:
                    raise OvsdbUnavailable(f"{self.endpoint} answered, but not as an OVSDB server") from None
                try:
                    message, end = _decoder.raw_decode(text)
                except ValueError:
                    pass  # not complete yet
                else:
                    if not isinstance(message, dict):
                        raise OvsdbUnavailable(f"{self.endpoint} answered, but not as an OVSDB server")
                    self._buf = text[end:].encode()
                    return message
            if len(data) > MAX_REPLY:
                raise OvsdbUnavailable(f"{self.endpoint} sent a reply larger than {MAX_REPLY} bytes")
            sock.settimeout(max(deadline - time.monotonic(), 0.001))
            chunk = sock.recv(1 << 16)
            if not chunk:
                raise OvsdbUnavailable(f"OVSDB at {self.endpoint} closed the connection without answering")
            self._buf = data + chunk

    def _rpc_ops(self, what: str, ops: list[dict[str, Any]]) -> list[Any]:
        """`ops` as one transaction: its per-operation results. A failed operation raises
        OvsdbFailure, except a failed `wait` (the rows changed since they were read): _Retry,
        carrying the index of that operation."""
        result = self._rpc_call(what, "transact", [DB, *ops])
        if not isinstance(result, list):
            raise OvsdbUnavailable(f"{self.endpoint} answered, but not as an OVSDB server")
        for index, one in enumerate(result):
            if isinstance(one, dict) and one.get("error"):
                if index < len(ops) and ops[index]["op"] == "wait" and one["error"] == "timed out":
                    raise _Retry(index)
                detail = f" ({one['details']})" if one.get("details") else ""
                raise OvsdbFailure(f"{what}: {one['error']}{detail}")
        if len(result) < len(ops):
            raise OvsdbFailure(f"{what}: OVSDB answered {len(result)} results for {len(ops)} operations")
        return result

    @staticmethod
    def _rpc_rows(result: Any) -> list[dict[str, Any]]:
        rows = result.get("rows") if isinstance(result, dict) else None
        return rows if isinstance(rows, list) else []

    def _rpc_select(self, what: str, *selects: dict[str, Any]) -> list[list[dict[str, Any]]]:
        return [self._rpc_rows(r) for r in self._rpc_ops(what, list(selects))]

    # ---- queries --------------------------------------------------------------------------
    def bridge_exists(self, bridge: str) -> bool:
        what = f"looking up bridge {bridge}"
        (rows,) = self._rpc_select(what, _select("Bridge", _where_name(bridge), ["_uuid"]))
        return bool(rows)

    def bridge_datapath(self, bridge: str) -> str:
        what = "reading bridge"
        (rows,) = self._rpc_select(what, _select("Bridge", _where_name(bridge), ["datapath_type"]))
        return str(rows[0].get("datapath_type", "")) if rows else ""

    def other_config(self) -> dict[str, str]:
        (rows,) = self._rpc_select("reading Open_vSwitch", _select("Open_vSwitch", [], ["other_config"]))
        return {str(k): str(v) for k, v in _map(rows[0].get("other_config")).items()} if rows else {}

    def port(self, name: str) -> PortState | None:
        what = f"reading port {name}"
        ports, ifaces = self._rpc_select(
            what,
            _select("Port", _where_name(name), ["_uuid", "interfaces", "tag", "trunks", "vlan_mode",
                                                 "external_ids"]),
            _select("Interface", _where_name(name), ["_uuid", "type", "ofport", "mtu", "error"]))
        if not ports:
            return None
        p = ports[0]
        uuid = _atom(p.get("_uuid"))
        (bridges,) = self._rpc_select(what, _select("Bridge", _holding("ports", uuid), ["name"]))
        members = set(_set(p.get("interfaces")))
        iface = next((i for i in ifaces if _atom(i.get("_uuid")) in members), None)
        return PortState(
            name=name,
            bridge=str(bridges[0]["name"]) if bridges else None,
            tag=_opt(p.get("tag")),
            trunks=sorted(_set(p.get("trunks"))),
            vlan_mode=_opt(p.get("vlan_mode")),
            external_ids=_map(p.get("external_ids")),
            interface_type=str(iface.get("type", "")) if iface is not None else "",
            ofport=_opt(iface.get("ofport")) if iface is not None else None,
            mtu=_opt(iface.get("mtu")) if iface is not None else None,
            error=_opt(iface.get("error")) if iface is not None else None,
        )

    def bridge_of_interface(self, ifname: str) -> str | None:
        """The bridge holding a port with interface `ifname` (a plain port or a bond member)."""
        what = "reading interfaces"
        (ifaces,) = self._rpc_select(what, _select("Interface", _where_name(ifname), ["_uuid"]))
        if not ifaces:
            return None
        iface = _atom(ifaces[0]["_uuid"])
        (ports,) = self._rpc_select(what, _select("Port", _holding("interfaces", iface), ["_uuid"]))
        for p in ports:
            holder = _holding("ports", _atom(p["_uuid"]))
            (bridges,) = self._rpc_select(what, _select("Bridge", holder, ["name"]))
            if bridges:
                return str(bridges[0]["name"])
        return None

    # ---- changes ------------------------------------------------------------------------
    def _cfg_ops(self, wait: bool) -> list[dict[str, Any]]:
        """With `wait`: bump next_cfg in the transaction and read its new value (last op)."""
        if not wait:
            return []
        return [_mutate("Open_vSwitch", [], [["next_cfg", "+=", 1]]),
                _select("Open_vSwitch", [], ["next_cfg"])]

    def _applied(self, what: str, results: list[Any], wait: bool) -> None:
        """Until ovs-vswitchd reports cur_cfg >= the transaction's next_cfg."""
        if not wait:
            return
        rows = self._rpc_rows(results[-1])
        if not rows:
            return
        next_cfg = int(rows[0]["next_cfg"])
        deadline = time.monotonic() + self.timeout
        pause = 0.0005
        while True:
            (cur,) = self._rpc_select(what, _select("Open_vSwitch", [], ["cur_cfg"]))
            if cur and int(cur[0]["cur_cfg"]) >= next_cfg:
                return
            if time.monotonic() > deadline:
                raise OvsdbUnavailable(f"{what}: ovs-vswitchd did not apply the change within "
                                       f"{self.timeout:g}s (ovsdbTimeout); is ovs-vswitchd running?")
            time.sleep(pause)
            pause = min(pause * 2, 0.01)

    @staticmethod
    def _merge_ids(ids: dict[str, str]) -> list[list[Any]]:
        """external_ids updated key by key (as ovsdbapp's db_set merges a map): our keys
        replaced, any others left as they are."""
        return [["external_ids", "delete", _oset(list(ids))], ["external_ids", "insert", _omap(ids)]]

    def add_port(self, spec: PortSpec) -> None:
        """Create the port with VLAN, MTU and ownership in one transaction (never half-made);
        an existing port of that name is reused and its columns set (ovsdbapp's may_exist)."""
        what = f"adding port {spec.name} to bridge {spec.bridge}"
        missing = f"bridge {spec.bridge!r} does not exist in OVSDB at {self.endpoint}"
        ids = {OWNER_KEY: OWNER, **spec.external_ids}
        port_cols: dict[str, Any] = {}
        if spec.tag is not None:
            port_cols["tag"] = spec.tag
        if spec.trunks:
            port_cols["trunks"] = _oset(list(spec.trunks))
        if spec.tag is not None and spec.trunks:
            # ovs-cni semantics: untagged pod traffic belongs to `vlan`, tagged traffic of the
            # trunk VLANs passes as is.
            port_cols["vlan_mode"] = "native-untagged"
        iface_cols: dict[str, Any] = {}
        if spec.mtu:
            iface_cols["mtu_request"] = spec.mtu
        if spec.ofport_request:
            iface_cols["ofport_request"] = spec.ofport_request
        bridge_is_there = _wait("Bridge", _where_name(spec.bridge), ["name"], "==", [{"name": spec.bridge}])
        for _ in range(ATTEMPTS):
            bridges, ports = self._rpc_select(what, _select("Bridge", _where_name(spec.bridge), ["_uuid"]),
                                          _select("Port", _where_name(spec.name), ["_uuid"]))
            if not bridges:
                raise BridgeNotFound(missing)
            named = _where_name(spec.name)
            if ports:  # may_exist: the port is reused, its columns set
                ops = [bridge_is_there,
                       _wait("Port", named, ["name"], "!=", []),
                       _wait("Interface", named, ["name"], "!=", []),
                       _mutate("Port", named, self._merge_ids(ids)),
                       _mutate("Interface", named, self._merge_ids(ids))]
                if port_cols:
                    ops.append({"op": "update", "table": "Port", "where": named, "row": port_cols})
                if iface_cols:
                    ops.append({"op": "update", "table": "Interface", "where": named, "row": iface_cols})
            else:
                ops = [bridge_is_there,
                       _wait("Port", named, ["name"], "==", []),
                       {"op": "insert", "table": "Interface", "uuid-name": "tn_iface",
                        "row": {"name": spec.name, "external_ids": _omap(ids), **iface_cols}},
                       {"op": "insert", "table": "Port", "uuid-name": "tn_port",
                        "row": {"name": spec.name, "interfaces": ["named-uuid", "tn_iface"],
                                "external_ids": _omap(ids), **port_cols}},
                       _mutate("Bridge", _where_name(spec.bridge),
                               [["ports", "insert", _oset([["named-uuid", "tn_port"]])]])]
            try:
                results = self._rpc_ops(what, ops + self._cfg_ops(self.wait_vswitchd))
            except _Retry as retry:
                if retry.args[0] == 0:
                    raise BridgeNotFound(missing) from None
                if ports and retry.args[0] == 2:
                    raise OvsdbFailure(f"{what}: Cannot find Interface with name={spec.name}") from None
                continue  # the port came or went since it was read
            break
        else:
            raise OvsdbUnavailable(f"{what}: the port kept changing in OVSDB at {self.endpoint}; try again")
        self._applied(what, results, self.wait_vswitchd)
        if self.wait_vswitchd:
            state = self.port(spec.name)
            if state is not None and (state.error or state.ofport == -1):
                raise OvsdbFailure(f"ovs-vswitchd could not add port {spec.name} to bridge "
                                   f"{spec.bridge}: {state.error or 'no OpenFlow port number'}")

    def delete_port(self, name: str, owner: tuple[str, str] | None = None, *, wait: bool = False) -> bool:
        """As `Ovsdb.delete_port`: a port we own, and with `owner` only if its external_ids
        still name that attachment; the transaction waits for the external_ids checked."""
        what = f"deleting port {name}"
        wait = wait or self.wait_vswitchd
        for _ in range(ATTEMPTS):
            (ports,) = self._rpc_select(what, _select("Port", _where_name(name), ["_uuid", "external_ids",
                                                                                "interfaces"]))
            if not ports:
                return False
            p = ports[0]
            ids = _map(p.get("external_ids"))
            if ids.get(OWNER_KEY) != OWNER:
                raise OvsdbFailure(f"port {name} exists but is not owned by tenantnet "
                                   f"(external_ids:{OWNER_KEY} missing); leaving it alone")
            if owner is not None and (ids.get(OWNER_CONTAINER), ids.get(OWNER_IFNAME)) != owner:
                return False  # ours, but another attachment's now
            uuid = _atom(p["_uuid"])
            ops = [_wait("Port", _where_uuid(uuid), ["external_ids"], "==",
                         [{"external_ids": p.get("external_ids")}]),
                   _mutate("Bridge", _holding("ports", uuid), [["ports", "delete", _oset([_uuid(uuid)])]]),
                   *({"op": "delete", "table": "Interface", "where": _where_uuid(i)}
                     for i in _set(p.get("interfaces"))),
                   {"op": "delete", "table": "Port", "where": _where_uuid(uuid)}]
            try:
                results = self._rpc_ops(what, ops + self._cfg_ops(wait))
            except _Retry:
                continue  # changed (or gone) since it was read: decide again
            self._applied(what, results, wait)
            return True
        raise OvsdbUnavailable(f"{what}: the port kept changing in OVSDB at {self.endpoint}; try again")
