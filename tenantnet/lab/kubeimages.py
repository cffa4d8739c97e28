"""The Kubernetes lab's images, built locally: there is no registry to pull from.

One layer — Debian's static busybox and a few applet links — under two image configs: the
sandbox ("pause") image containerd's CRI starts for every pod (it only sleeps; the CRI kills
a sandbox with SIGKILL, so it needs no signal handling), and the image test pods run
(`imagePullPolicy: Never`). Written as one `docker save`-format archive and imported with
`ctr -n k8s.io images import` into the lab's containerd.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

from tenantnet.lab.ovs import LabError

BUSYBOX = "/bin/busybox"  # Debian's busybox-static
PAUSE_IMAGE = "localhost/tenantnet-lab/pause:lab"
BUSYBOX_IMAGE = "localhost/tenantnet-lab/busybox:lab"
APPLETS = ("sh", "sleep", "ping", "ip", "cat", "ls", "echo", "hostname", "ps", "true", "wget", "nc")


def _layer() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in ("bin", "etc", "tmp", "proc", "sys", "dev", "root"):
            info = tarfile.TarInfo(d)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o1777 if d == "tmp" else 0o755, 0
            tar.addfile(info)
        with open(BUSYBOX, "rb") as fh:
            data = fh.read()
        info = tarfile.TarInfo("bin/busybox")
        info.size, info.mode, info.mtime = len(data), 0o755, 0
        tar.addfile(info, io.BytesIO(data))
        for applet in APPLETS:
            info = tarfile.TarInfo(f"bin/{applet}")
            info.type, info.linkname, info.mode, info.mtime = tarfile.SYMTYPE, "busybox", 0o777, 0
            tar.addfile(info)
    return buf.getvalue()


def build_archive(path: Path) -> list[str]:
    """Write the images' archive to `path`; returns the image names in it."""
    if not os.path.exists(BUSYBOX):
        raise LabError(f"{BUSYBOX} is missing (apt-get install busybox-static)")
    layer = _layer()
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    manifest = []
    blobs: dict[str, bytes] = {"layer.tar": layer}
    for name, cmd in ((PAUSE_IMAGE, ["/bin/sleep", "2147483647"]), (BUSYBOX_IMAGE, ["/bin/sh"])):
        config = json.dumps({
            "architecture": "amd64", "os": "linux", "created": "2026-01-01T00:00:00Z",
            "config": {"Cmd": cmd, "Env": ["PATH=/bin"], "WorkingDir": "/"},
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
            "history": [{"created": "2026-01-01T00:00:00Z", "created_by": "tenantnet lab (busybox-static)"}],
        }, sort_keys=True).encode()
        config_name = hashlib.sha256(config).hexdigest() + ".json"
        blobs[config_name] = config
        manifest.append({"Config": config_name, "RepoTags": [name], "Layers": ["layer.tar"]})
    blobs["manifest.json"] = json.dumps(manifest).encode()
    with tarfile.open(path, "w") as tar:
        for name, data in blobs.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    return [PAUSE_IMAGE, BUSYBOX_IMAGE]
