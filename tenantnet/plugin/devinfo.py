"""Device information files (NPWG Device Information Spec 1.1.0) for Multus and the pod.

Multus passes a path in `runtimeConfig.CNIDeviceInfoFile` (when the NAD declares the
capability); the plugin may read, update or create the file. The path is tenant input (a
NAD may carry its own runtimeConfig), so it is honoured only inside the node config's
`deviceInfoDir` (tenantnet.plugin.settings), and read and written through `hostfiles.confined`: no
symlinks, no FIFOs, bounded. A device plugin may already have written one, so existing keys
are kept and ours merged in; written atomically (temp file + rename, mode 0600) so a reader
never sees half a file, and removed on DEL.
"""

from __future__ import annotations

import json
from typing import Any

from cni.errors import CniError
from cni.netconf import bounded_loads
from hostfiles.confined import read_confined, remove_confined, write_confined

SPEC_VERSION = "1.1.0"
FIELD = "runtimeConfig.CNIDeviceInfoFile"


def read(path: str, directory: str) -> dict[str, Any]:
    """The file's document; {} if it is missing or not JSON."""
    try:
        data = read_confined(FIELD, path, (directory,), "a file", missing_ok=True)
    except CniError:
        raise
    try:
        doc = bounded_loads(data.decode("utf-8")) if data else {}
    except (ValueError, UnicodeDecodeError):
        return {}
    return doc if isinstance(doc, dict) else {}


def write(path: str, pci: dict[str, str], directory: str) -> dict[str, Any]:
    """Merge `pci` into the file at `path` (created if missing); returns what was written."""
    current = read(path, directory)
    given = current.get("pci")
    merged_pci: dict[str, Any] = given if isinstance(given, dict) else {}
    doc = {**current, "type": "pci", "version": SPEC_VERSION, "pci": {**merged_pci, **pci}}
    write_confined(FIELD, path, (directory,), json.dumps(doc, indent=2).encode(), mode=0o600)
    return doc


def remove(path: str, directory: str) -> bool:
    """Remove the file DEL found in the record (only a regular file inside `directory`)."""
    return remove_confined(path, (directory,))
