"""The frames that make a datapath flow exist before the workload's first packet
(drivers/prewarm.py says when and between whom).

A datapath flow is made by the first packet that misses the datapath: OVS translates it
through the OpenFlow tables and installs a flow (a megaflow) matching exactly the fields
the translation looked at. With pre-warm's rules that is the in_port, both MAC addresses,
the EtherType (always exact) and, for IP, "not a fragment" — so one frame per EtherType and
direction makes the flow every later packet of that pair and EtherType hits.

The frames are built to go nowhere past the peer's NIC driver:
- IPv4: a header whose checksum is deliberately wrong; the peer's kernel drops it in
  ip_rcv (counted as InHdrErrors) before any protocol sees it.
- IPv6: next header 59 ("no next header") to the unspecified address; dropped.
- ARP: a hardware address length of 0; arp_rcv drops it.
They are sent from inside the pod's namespace on its interface (an AF_PACKET socket), so
they enter OVS on the pod's port exactly as the workload's packets will.
"""

from __future__ import annotations

import socket
import struct
import threading

from tenantnet.plugin.system import netns

ETH_P_IP, ETH_P_ARP, ETH_P_IPV6 = 0x0800, 0x0806, 0x86DD
MARK = b"tenantnet-prewarm"  # visible in a capture, so nobody mistakes them for traffic
_MIN_PAYLOAD = 46  # Ethernet's minimum: short frames are padded by some drivers, not all


def _mac(text: str) -> bytes:
    raw = bytes.fromhex(text.replace(":", ""))
    if len(raw) != 6:
        raise ValueError(f"not a MAC address: {text!r}")
    return raw


def _ipv4_checksum(header: bytes) -> int:
    total: int = sum(struct.unpack(f"!{len(header) // 2}H", header))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def ipv4_payload() -> bytes:
    body = MARK.ljust(_MIN_PAYLOAD - 20, b"\0")
    header = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(body), 0, 0x4000, 1, 253, 0, bytes(4), bytes(4))
    good = _ipv4_checksum(header)
    bad = (good + 1) & 0xFFFF or 1  # anything but the right one (and never "no checksum")
    return header[:10] + struct.pack("!H", bad) + header[12:] + body


def ipv6_payload() -> bytes:
    body = MARK
    header = struct.pack("!IHBB16s16s", 6 << 28, len(body), 59, 1, bytes(16), bytes(16))
    return (header + body).ljust(_MIN_PAYLOAD, b"\0")


def arp_payload() -> bytes:
    # htype Ethernet, ptype IPv4, hlen 0 (invalid), plen 4, op request
    return struct.pack("!HHBBH", 1, ETH_P_IP, 0, 4, 1).ljust(_MIN_PAYLOAD, b"\0")


_PAYLOADS = {ETH_P_IP: ipv4_payload, ETH_P_ARP: arp_payload, ETH_P_IPV6: ipv6_payload}


def frame(src_mac: str, dst_mac: str, ethertype: int) -> bytes:
    return _mac(dst_mac) + _mac(src_mac) + struct.pack("!H", ethertype) + _PAYLOADS[ethertype]()


def send(netns_path: str, ifname: str, frames: list[bytes]) -> None:
    """Send `frames` out of `ifname` inside the namespace at `netns_path`."""
    def bound() -> socket.socket:
        # Protocol 0: the socket only sends, so no receive hook is registered for it.
        sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
        try:
            sock.bind((ifname, 0))
        except OSError:
            sock.close()
            raise
        return sock

    sock = netns.open_socket_inside(netns_path, bound)
    try:
        for f in frames:
            sock.send(f)
    finally:
        # Closing a packet socket waits for an RCU grace period (packet_release calls
        # synchronize_net: 10-15 ms here) — on a thread of its own, not the ADD's.
        threading.Thread(target=sock.close, name="tenantnet-frame-close", daemon=True).start()
