"""Device information files (NPWG Device Information Spec 1.1.0) for Multus and the pod.

Multus passes a path in `runtimeConfig.CNIDeviceInfoFile` (when the NAD declares the
capability); the plugin may read, update or create the file. A device plugin may already
have written one, so existing keys are kept and ours merged in. Written atomically (temp
file + rename) so a reader never sees half a file.
"""

from __future__ import annotations

import json
import os
from typing import Any

from cni.errors import CniError, Code

SPEC_VERSION = "1.1.0"


def _check_path(path: Any) -> str:
    if not isinstance(path, str) or not path.startswith("/") or "\0" in path:
        raise CniError(Code.INVALID_CONFIG, f"invalid network config: runtimeConfig.CNIDeviceInfoFile="
                                            f"{path!r}: must be an absolute file path")
    if os.path.normpath(path) != path or path.endswith("/"):
        raise CniError(Code.INVALID_CONFIG, f"invalid network config: runtimeConfig.CNIDeviceInfoFile="
                                            f"{path!r}: must be a plain path (no '..', '.', '//')")
    return path


def read(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (FileNotFoundError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write(path: Any, pci: dict[str, str]) -> dict[str, Any]:
    """Merge `pci` into the file at `path` (created if missing); returns what was written."""
    path = _check_path(path)
    current = read(path)
    merged_pci = current.get("pci") if isinstance(current.get("pci"), dict) else {}
    doc = {**current, "type": "pci", "version": SPEC_VERSION, "pci": {**merged_pci, **pci}}
    directory = os.path.dirname(path)
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        os.makedirs(directory, mode=0o755, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=2)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise CniError(Code.IO_FAILURE,
                       f"cannot write device info file {path}: {exc.strerror or exc}") from None
    return doc
