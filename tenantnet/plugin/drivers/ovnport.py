"""The OVN side of an overlay attachment (docs/overlay.md), shared by the modes that make an
OVS port (`ovs`, `ovs-offload`): its logical switch port in the northbound database, with
port security, bound on this node by the OVS port's `external_ids:iface-id`.

Order of an ADD: the OVS port (with iface-id) is written by the driver's attach, beside the
pod's veth; the logical port only once IPAM has answered (`bind`, run beside the pod's
address setup), because its addresses and port security are "MAC IP...": a port written
before would have to be written twice. ovn-controller binds the two when both exist,
whichever came first. A DEL removes the logical port (ours, this attachment's only) and the
OVS port; GC removes logical ports of this node and network that no record holds.

Two OVSDB clients, on purpose: the local OVS port keeps tenantnet's direct JSON-RPC client
(tenantnet.plugin.system.ovsdb: one `transact` per port, no replica; docs/architecture.md
measures why), and the northbound database is driven through ovsdbapp
(tenantnet.plugin.system.ovnnb) with a replica bounded to this node's own ports by
conditional monitoring.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from cni.errors import CniError, Code
from tenantnet.plugin import digest, faults
from tenantnet.plugin.nodeconfig import NodeConfig, node_name_of
from tenantnet.plugin.records import AttachmentRecord
from tenantnet.plugin.system.ovsdb import OWNER_CONTAINER, OWNER_IFNAME, Ovsdb
from tenantnet.plugin.tenantnetworks import NETWORK_FIELD as TENANT_NETWORK_FIELD

STEP_LSP = "lsp"
SWITCH_SEEN_FOR = 30.0  # s a switch this process ensured is taken as still there
_switches_seen: dict[tuple[str, str], float] = {}
_seen_lock = threading.Lock()


def node_name(node: NodeConfig) -> str:
    """The node name logical ports carry (not a chassis's: a node may have one per rail)."""
    return node_name_of(node)


def port_name(node: str, container_id: str, ifname: str) -> str:
    """The logical switch port of an attachment: unique in the NB (node + attachment),
    derived from names alone so that a DEL without a record or GC finds it again."""
    return "tn" + digest.sha256_hex(f"{container_id}/{ifname}".encode())[:11] + "." + node


def pod_mac(network: str, container_id: str, ifname: str) -> str:
    """A MAC fixed before anything exists (port security names it): locally administered,
    unicast, derived from the attachment."""
    h = digest.sha256_hex(f"{network}/{container_id}/{ifname}".encode())
    return "0a:" + ":".join(h[i:i + 2] for i in range(0, 10, 2))


def _nb(node: NodeConfig, endpoint: str, timeout: float):  # type: ignore[no-untyped-def]
    from tenantnet.plugin.system import ovnnb

    return ovnnb.connect(endpoint, ovnnb.Scope(node=node_name(node)), timeout)


def _translated(exc: Exception, doing: str) -> CniError:
    from tenantnet.plugin.system import ovnnb

    if isinstance(exc, ovnnb.NbUnavailable):  # transient: the runtime retries
        return CniError(Code.TRY_AGAIN_LATER, f"{doing}: {exc}")
    return CniError(Code.OVSDB_FAILURE, f"{doing}: {exc}")


@dataclass(frozen=True)
class Installed:
    """Where to see that ovn-controller has installed an attachment's flows: its OVS
    Interface (`port` on `bridge`, in `db`) gets `external_ids:ovn-installed=true`."""

    db: Ovsdb
    port: str
    bridge: str
    timeout: float  # 0: do not wait


INSTALLED = "ovn-installed"


def wait_installed(installed: Installed, lsp: str) -> None:
    """Until ovn-controller has marked the port installed; CniError 11 past the time-out."""
    if installed.timeout <= 0 or not installed.port:
        return
    deadline = time.monotonic() + installed.timeout
    pause = 0.001  # ovn-controller takes a few ms once both rows exist: look often, then less
    while True:
        ids = installed.db.interface_ids(installed.port)
        if ids is not None and ids.get(INSTALLED) == "true" and ids.get("iface-id") == lsp:
            faults.step("ovn.installed")
            return
        if time.monotonic() >= deadline:
            raise CniError(Code.TRY_AGAIN_LATER,
                           f"ovn-controller did not install logical port {lsp} (OVS port {installed.port} on "
                           f"{installed.bridge}) within {installed.timeout:g}s: is the ovn-controller of "
                           "that bridge's chassis running and connected to the southbound database? "
                           "(node config ovn.installTimeout)")
        time.sleep(pause)
        # Capped low: a look costs ~0.2 ms, and a pause grown past it would see the mark late.
        pause = min(pause * 2, 0.002)


def bind(node: NodeConfig, record: AttachmentRecord, network: str, segment: int | None, switch: str,
         endpoint: str, timeout: float, lsp: str, mac: str, ips: list[str],
         installed: Installed | None = None) -> None:
    """The attachment's logical switch port, its switch made first if no one has (the agent
    creates a missing switch without a tunnel key; a TenantNetwork's is the renderer's);
    then, with `installed`, until ovn-controller has installed its flows."""
    from tenantnet.plugin.system import ovnnb

    nb = _nb(node, endpoint, timeout)
    doing = f"OVN northbound {endpoint}, logical port {lsp} on {switch}"
    try:
        key, now = (endpoint, switch), time.monotonic()
        with _seen_lock:
            fresh = now - _switches_seen.get(key, -SWITCH_SEEN_FOR) < SWITCH_SEEN_FOR
        # A switch of a TenantNetwork carries its mark, as the renderer's own would, so that the
        # renderer retires it with the network even if it never saw it before.
        tenant_network = record.conf.get(TENANT_NETWORK_FIELD)
        marks = {ovnnb.OWNER_TENANT_NETWORK: tenant_network} if isinstance(tenant_network, str) else {}
        if not fresh:
            nb.ensure_switch(network, external_ids=marks, segment=segment, create_only=True)
            with _seen_lock:
                _switches_seen[key] = now
        faults.step("ovn.lsp-adding")
        ids = {ovnnb.OWNER_NETWORK: network, OWNER_CONTAINER: record.container_id,
               OWNER_IFNAME: record.ifname}
        try:
            nb.add_port(switch, lsp, mac, ips, ids)
        except ovnnb.SwitchNotFound:  # removed since it was seen: make it again, once
            with _seen_lock:
                _switches_seen.pop(key, None)
            nb.ensure_switch(network, external_ids=marks, segment=segment, create_only=True)
            nb.add_port(switch, lsp, mac, ips, ids)
        faults.step("ovn.lsp-added")
    except ovnnb.NbNotConnected as exc:
        # Nothing reached the NB: there is no logical port to undo (a rollback that would
        # fail on the same NB keeps the record instead; this one leaves nothing behind).
        if record.progress is not None:
            record.progress.discard(STEP_LSP)
        raise _translated(exc, doing) from None
    except (ovnnb.NbFailure, ovnnb.NbUnavailable) as exc:
        raise _translated(exc, doing) from None
    if installed is not None:
        wait_installed(installed, lsp)


def unbind(node: NodeConfig, record: AttachmentRecord, endpoint: str, timeout: float, lsp: str) -> None:
    """Remove the attachment's logical port: only ours, only while it is still this
    attachment's (container id, ifname); none there is done already."""
    from tenantnet.plugin.system import ovnnb

    try:
        _nb(node, endpoint, timeout).delete_port(lsp, owner=(record.container_id, record.ifname))
    except (ovnnb.NbFailure, ovnnb.NbUnavailable) as exc:
        raise _translated(exc, f"OVN northbound {endpoint}, removing logical port {lsp}") from None
    faults.step("ovn.lsp-deleted")


def unrecorded(node: NodeConfig, endpoint: str, timeout: float, network: str,
               known: set[tuple[str, str]]) -> list[tuple[str, str, str]]:
    """(logical port, container id, ifname) of this node's ports on `network` that no record
    holds (GC)."""
    from tenantnet.plugin.system import ovnnb

    try:
        ports = _nb(node, endpoint, timeout).ports_of(network=network)
    except (ovnnb.NbFailure, ovnnb.NbUnavailable) as exc:
        raise _translated(exc, f"OVN northbound {endpoint}, listing this node's logical ports") from None
    return [(p.name, p.container_id, p.ifname) for p in ports
            if (p.container_id, p.ifname) not in known]


def drift(node: NodeConfig, endpoint: str, timeout: float, lsp: str, mac: str, ips: list[str]) -> list[str]:
    """CHECK: the logical port is there with the addresses and port security it was given."""
    from tenantnet.plugin.system import ovnnb

    try:
        ports = {p.name: p for p in _nb(node, endpoint, timeout).ports_of()}
    except (ovnnb.NbFailure, ovnnb.NbUnavailable) as exc:
        return [f"OVN northbound {endpoint}: {exc}"]
    port = ports.get(lsp)
    if port is None:
        return [f"logical switch port {lsp} is missing from the OVN northbound database"]
    want = " ".join([mac.lower(), *(ip.split("/")[0] for ip in ips)])
    out = []
    if port.port_security != [want]:
        out.append(f"logical switch port {lsp} has port_security {port.port_security}, expected [{want!r}]")
    if port.addresses != [want]:
        out.append(f"logical switch port {lsp} has addresses {port.addresses}, expected [{want!r}]")
    return out
