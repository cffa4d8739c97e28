"""The renderer's OVN logical switches: one per accepted overlay TenantNetwork.

The renderer owns the switch `tn-<network>.<segment>` of every accepted overlay
TenantNetwork (tnrender.overlay_switch) and its tunnel key: `other_config:requested-tnl-key`
= the segment, so the segment is the Geneve VNI (ovn-northd honours the request). Nodes'
agents only create a missing switch (without a key) and add/remove their logical ports.

What it touches, and when:
- a switch it writes carries tenantnet's ownership ids (tenantnet-owner, tenantnet-network,
  tenantnet-switch) and RENDERED_BY = the TenantNetwork's name: the mark that it is the
  switch of a TenantNetwork, not of a hand-written NAD's network (whose switch the agents
  made and nobody else removes);
- a switch of the wanted name that is not tenantnet's is left alone (named in status);
  one of ours that the agent made first gets the key and the mark;
- a marked switch no longer wanted (its TenantNetwork gone, refused, no longer an overlay,
  or moved to another segment) is deleted only while it has no logical ports: the ports
  are the nodes' agents' (their pods'), and the NB would garbage-collect them with it. The
  check and the delete are one transaction (a `wait` on `ports` being empty and the ids
  unchanged), so a port an agent links meanwhile makes the delete fail, not vanish.

Why plain OVSDB transactions here and not ovnnb.OvnNb (the agent's ovsdbapp handle):
OvnNb's replica leaves the switches' `ports` column out (conditional monitoring, its
module says why), and "no ports left" must be checked by the server in the delete's own
transaction; the create must be conditional too (switch names are not unique in the NB
schema: a `wait` for no row of that name, then the insert). The renderer reconciles every
few seconds at most, so one `select` per round needs no replica either.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tenantnet.plugin.system.ovnnb import (
    DB,
    OWNER_NETWORK,
    OWNER_TENANT_NETWORK,
    TNL_KEY,
    NbFailure,
    NbUnavailable,
)
from tenantnet.plugin.system.ovsdb import OWNER, OWNER_KEY, Ovsdb, OvsdbFailure, OvsdbUnavailable, WaitFailed
from tenantnet.plugin.tnrender import overlay_switch

OWNER_SWITCH = "tenantnet-switch"
RENDERED_BY = OWNER_TENANT_NETWORK  # the TenantNetwork whose switch this is (the renderer's mark)
_LS = "Logical_Switch"

# status.overlay.state
READY = "Ready"
UNREACHABLE = "NbUnavailable"
NOT_OURS = "NotOurs"
PORTS_REMAIN = "PortsRemain"
FAILED = "Failed"


@dataclass(frozen=True)
class SwitchStatus:
    """What a TenantNetwork's status.overlay says."""

    switch: str
    state: str
    message: str
    tunnel_key: int | None = None

    def as_status(self) -> dict[str, Any]:
        out: dict[str, Any] = {"switch": self.switch, "state": self.state, "message": self.message[:1024]}
        if self.tunnel_key is not None:
            out["tunnelKey"] = self.tunnel_key
        return out


@dataclass
class SyncResult:
    statuses: dict[str, SwitchStatus] = field(default_factory=dict)  # by TenantNetwork name
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    kept: dict[str, int] = field(default_factory=dict)  # switch -> ports still on it
    unreachable: str = ""  # the NB could not be reached: everything waits for the next round


def _map(value: Any) -> dict[str, str]:
    if isinstance(value, list) and len(value) == 2 and value[0] == "map":
        return {str(k): str(v) for k, v in value[1]}
    return {}


def _set_len(value: Any) -> int:
    if isinstance(value, list) and len(value) == 2 and value[0] == "set":
        return len(value[1])
    return 1 if isinstance(value, list) and value and value[0] == "uuid" else 0


def _omap(ids: dict[str, str]) -> list[Any]:
    return ["map", sorted([k, v] for k, v in ids.items())]


class SwitchKeeper:
    """The logical switches of the overlay TenantNetworks in one NB."""

    def __init__(self, endpoint: str, timeout: float = 5.0) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        self._db: Ovsdb | None = None

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def _transact(self, what: str, ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if self._db is None:
            self._db = Ovsdb(self.endpoint, self.timeout, timeout_source="the renderer's --ovn-timeout")
        try:
            result = self._db._rpc_ops(what, ops, database=DB)
        except OvsdbUnavailable as exc:
            self.close()
            raise NbUnavailable(str(exc)) from None
        except OvsdbFailure as exc:
            raise NbFailure(str(exc)) from None
        return [r if isinstance(r, dict) else {} for r in result]

    def switches(self, names: list[str] | None = None
                 ) -> tuple[list[dict[str, Any]], dict[str, list[dict[str, Any]]]]:
        """(tenantnet's switches, the switches named `names` whoever's), one transaction."""
        columns = ["_uuid", "name", "external_ids", "other_config"]
        owned = [["external_ids", "includes", _omap({OWNER_KEY: OWNER})]]
        ops = [{"op": "select", "table": _LS, "where": owned, "columns": columns}]
        wanted = list(names or [])
        ops += [{"op": "select", "table": _LS, "where": [["name", "==", n]], "columns": columns}
                for n in wanted]
        result = self._transact("reading the logical switches", ops)
        rows = [r.get("rows") or [] for r in result]
        return rows[0], dict(zip(wanted, rows[1:], strict=True))

    def sync(self, wanted: dict[str, int]) -> SyncResult:
        """Make the NB hold the switch of each overlay TenantNetwork in `wanted` (name ->
        segment), with its tunnel key, and remove the marked switches of the others (while
        empty). An unreachable NB stops the round at once (`unreachable`), changing nothing."""
        out = SyncResult()
        names = {overlay_switch(n, seg): (n, seg) for n, seg in sorted(wanted.items())}
        try:
            ours, by_name = self.switches(list(names))
            for switch, (network, segment) in names.items():
                out.statuses[network] = self._ensure(switch, network, segment, by_name[switch], out)
            for row in ours:
                ids = _map(row.get("external_ids"))
                if row.get("name") in names or RENDERED_BY not in ids:
                    continue  # wanted, or not a TenantNetwork's (a hand-written NAD's: the agents')
                self._retire(row, ids, out)
        except NbUnavailable as exc:
            out.unreachable = str(exc)
            for switch, (network, segment) in names.items():
                out.statuses[network] = SwitchStatus(
                    switch, UNREACHABLE, f"the OVN northbound database is unreachable ({exc}); the renderer "
                    "retries", segment if network not in out.statuses else out.statuses[network].tunnel_key)
        return out

    def _ensure(self, switch: str, network: str, segment: int, rows: list[dict[str, Any]],
                out: SyncResult) -> SwitchStatus:
        mine = [r for r in rows if _map(r.get("external_ids")).get(OWNER_KEY) == OWNER]
        if len(mine) != len(rows):
            return SwitchStatus(switch, NOT_OURS,
                                f"a logical switch named {switch} exists in the NB and is not tenantnet's "
                                f"(external_ids:{OWNER_KEY} missing); left alone, no tunnel key set")
        ids = {OWNER_KEY: OWNER, OWNER_NETWORK: network, OWNER_SWITCH: switch, RENDERED_BY: network}
        try:
            if not mine:
                self._transact(f"creating logical switch {switch}", [
                    {"op": "wait", "table": _LS, "where": [["name", "==", switch]], "columns": ["name"],
                     "until": "==", "rows": [], "timeout": 0},
                    {"op": "insert", "table": _LS, "row": {
                        "name": switch, "external_ids": _omap(ids),
                        "other_config": _omap({TNL_KEY: str(segment)})}}])
                out.created.append(switch)
            else:
                if len(mine) > 1:
                    # Switch names are not unique in the schema: two agents may each have made it.
                    # The key goes on one; the NB refuses nothing, northd would give the twin another.
                    return SwitchStatus(switch, FAILED,
                                        f"{len(mine)} logical switches named {switch} are tenantnet's (made "
                                        "at once by agents); remove the empty twin", segment)
                row = mine[0]
                have_ids, other = _map(row.get("external_ids")), _map(row.get("other_config"))
                if any(have_ids.get(k) != v for k, v in ids.items()) or other.get(TNL_KEY) != str(segment):
                    uuid = row["_uuid"]
                    self._transact(f"setting the tunnel key of logical switch {switch}", [
                        # Still ours as read (an operator may have taken it meanwhile).
                        {"op": "wait", "table": _LS, "where": [["_uuid", "==", uuid]],
                         "columns": ["external_ids"], "until": "==",
                         "rows": [{"external_ids": row.get("external_ids")}], "timeout": 0},
                        {"op": "update", "table": _LS, "where": [["_uuid", "==", uuid]],
                         "row": {"external_ids": _omap({**have_ids, **ids}),
                                 "other_config": _omap({**other, TNL_KEY: str(segment)})}}])
                    out.updated.append(switch)
        except WaitFailed:  # the switch changed since it was read
            return SwitchStatus(switch, FAILED, f"logical switch {switch} changed while being written; "
                                "the next round tries again", segment)
        except NbFailure as exc:
            return SwitchStatus(switch, FAILED, str(exc), segment)
        return SwitchStatus(switch, READY, f"logical switch {switch}, tunnel key {segment}", segment)

    def _retire(self, row: dict[str, Any], ids: dict[str, str], out: SyncResult) -> None:
        switch, uuid = str(row.get("name")), row["_uuid"]
        try:
            self._transact(f"deleting logical switch {switch}", [
                {"op": "wait", "table": _LS, "where": [["_uuid", "==", uuid]],
                 "columns": ["ports", "external_ids"], "until": "==",
                 "rows": [{"ports": ["set", []], "external_ids": row.get("external_ids")}], "timeout": 0},
                {"op": "delete", "table": _LS, "where": [["_uuid", "==", uuid]]}])
            out.deleted.append(switch)
            return
        except WaitFailed:  # a port was linked, or the switch changed, since it was read: kept
            pass
        except NbFailure as exc:
            _also(out, ids[RENDERED_BY], SwitchStatus(switch, FAILED, str(exc)))
            return
        rows = self._transact(f"counting the ports of logical switch {switch}", [
            {"op": "select", "table": _LS, "where": [["_uuid", "==", uuid]], "columns": ["ports"]},
        ])[0].get("rows")
        ports = _set_len(rows[0].get("ports")) if rows else 0
        out.kept[switch] = ports
        _also(out, ids[RENDERED_BY], SwitchStatus(
            switch, PORTS_REMAIN, f"logical switch {switch} is no longer wanted but {ports} logical ports "
            "remain on it: they are the nodes' agents' (their pods'); it is deleted once they are gone"))


def _also(out: SyncResult, network: str, retired: SwitchStatus) -> None:
    """A retired switch's status: the network's own, or (the network moved to another
    segment and has its new switch) appended to the new switch's message."""
    now = out.statuses.get(network)
    if now is None:
        out.statuses[network] = retired
    else:
        out.statuses[network] = SwitchStatus(now.switch, now.state, f"{now.message}; {retired.message}",
                                             now.tunnel_key)
