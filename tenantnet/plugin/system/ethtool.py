"""The one ethtool setting tenantnet changes: TX checksum offload of a pod's veth end on an
OVS userspace datapath (docs/overlay.md).

A veth leaves TX checksums to whoever takes the frame next; the kernel datapath completes
them, OVS's userspace datapath (dpif-netdev, the lab's) sends them on unfinished, so TCP
across the overlay fails until the pod end computes its own (CNI-FACTS §7). `ethtool -K
<if> tx off` is the SIOCETHTOOL ioctl ETHTOOL_STXCSUM; the ioctl acts in the namespace of
the socket it is made on, so the socket is opened inside the pod's namespace.
"""

from __future__ import annotations

import ctypes
import fcntl
import socket
import struct

SIOCETHTOOL = 0x8946
ETHTOOL_GTXCSUM = 0x16
ETHTOOL_STXCSUM = 0x17


def set_tx_checksum(sock: socket.socket, ifname: str, on: bool) -> None:
    """Set `ifname`'s TX checksum offload through `sock`, a socket of the interface's
    namespace (any family: a netlink socket the caller holds there does)."""
    _tx_checksum(sock, ifname, on)


def _tx_checksum(sock: socket.socket, ifname: str, on: bool | None) -> bool:
    command = ETHTOOL_GTXCSUM if on is None else ETHTOOL_STXCSUM
    value = ctypes.create_string_buffer(struct.pack("II", command, int(bool(on))))
    ifr = struct.pack("16sP", ifname.encode(), ctypes.addressof(value))
    fcntl.ioctl(sock.fileno(), SIOCETHTOOL, ifr)
    return bool(struct.unpack("II", value.raw[:8])[1]) if on is None else bool(on)


def tx_checksum(netns_path: str, ifname: str, on: bool | None = None) -> bool:
    """Read (`on` None) or set the TX checksum offload of `ifname` in the namespace at
    `netns_path`; returns the state read back from the kernel."""
    from tenantnet.plugin.system.netns import open_socket_inside

    sock = open_socket_inside(netns_path, lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
    try:
        if on is not None:
            _tx_checksum(sock, ifname, on)
        return _tx_checksum(sock, ifname, None)
    finally:
        sock.close()
