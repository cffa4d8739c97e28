"""Device information files (NPWG Device Information Spec 1.1.0) for Multus and the pod.

Multus passes a path in `runtimeConfig.CNIDeviceInfoFile`; the plugin may create the file.
The path is tenant input (libcni passes a NAD's own runtimeConfig through), and the
directory also holds Multus's and the device plugin's files under predictable names, so:

- **Which name.** Only the one Multus derives for this attachment is accepted:
  `<deviceInfoDir>/<NAD namespace>-<NAD name>-<containerID>_<ifname>` (Multus's
  `delegateRuntimeConfig` with the network-attachment-definition client's
  `GetCNIDeviceInfoPath`; `deviceInfoDir` is Multus's `…/devinfo/cni` — or, when a node
  config names the base `…/devinfo` as earlier releases did, its `cni/` folder). The NAD's
  namespace and name there are the NAD *object's*, from the pod's network selection — not
  the config's `name`, and not necessarily the pod's namespace — and the plugin is told
  neither, so they are checked for shape only (two Kubernetes names); the container id and
  ifname, which tie the file to this attachment, must be this call's. Else: code 7.
- **Whose file.** tenantnet writes a file only where nothing is: it writes a staging file
  beside it (`.<name>.tenantnet`, a name no accepted path can take), records its identity
  in the attachment record — device, inode and a modification time of nanoseconds it
  chose (an inode number alone is reused at once by the next file made there) — then
  links it to the name, which fails if anything is there already (Multus copies the device
  plugin's file to this name before it calls the delegate; that file is kept as it is).
  DEL removes a file only while its identity is still the recorded one: a file tenantnet
  did not write for this attachment is never replaced or removed.
- **Where.** `deviceInfoDir` (the admin's) is made when missing (`/var/run` is emptied by a
  reboot, and the plugin may run before the DaemonSet recreates it, as sriov-cni does),
  each missing level with `mkdir` and checked with `lstat` — never through a symlink —
  0755 above `deviceInfoDir` (`…/k8s.cni.cncf.io`, `…/devinfo`), 0700 for `deviceInfoDir`.
"""

from __future__ import annotations

import errno
import json
import os
import re
import secrets
import stat
import time
from dataclasses import dataclass
from typing import Any

from cni.errors import CniError, Code, invalid_config
from hostfiles.confined import confined

SPEC_VERSION = "1.1.0"
FIELD = "runtimeConfig.CNIDeviceInfoFile"
NAME_MAX = 255
# A Kubernetes namespace (DNS label) and a NAD name (DNS subdomain), joined by Multus's "-".
_NAD_PREFIX = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?-[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?")
_OPEN = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY


def folders(directory: str) -> tuple[str, str]:
    """Where the files may be: `deviceInfoDir` itself (Multus's `…/devinfo/cni`), or its
    `cni/` folder (a node config naming Multus's base directory `…/devinfo`)."""
    base = directory.rstrip("/") or "/"
    return base, os.path.join(base, "cni")


def accepted(value: object, container_id: str, ifname: str, directory: str) -> str:
    """`value` if it is the device-info file Multus names for the attachment (container id,
    ifname) below `directory`; code 7 naming the field, the value and the form otherwise."""
    folder = folders(directory)[0]
    suffix = f"-{container_id}_{ifname}"
    form = f"{folder}/<NAD namespace>-<NAD name>{suffix}"
    path = confined(FIELD, value, (directory,), f"the file Multus names for this attachment ({form})")
    name = os.path.basename(path)
    if os.path.dirname(path) not in folders(directory) or not name.endswith(suffix) \
            or not _NAD_PREFIX.fullmatch(name[:-len(suffix)]):
        raise invalid_config(FIELD, value, f"must be the file Multus names for this attachment: {form} "
                                           "(another pod's or another plugin's file is never written)")
    longest = NAME_MAX - len(os.path.basename(staging_path(path))) + len(name)  # the staging name's room
    if len(name.encode()) > longest:
        raise invalid_config(FIELD, value, f"has a file name longer than {longest} bytes")
    return path


def staging_path(path: str) -> str:
    """Where the file is written before it gets its name (never an accepted name: a dot first)."""
    return os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.tenantnet")


def identity(st: os.stat_result) -> str:
    """What tells our file from one made in its place: device, inode and modification time
    (ADD sets it to a value of its own; link() keeps it, a write by anyone changes it)."""
    return f"{st.st_dev}:{st.st_ino}:{st.st_mtime_ns}"


def ensure_directory(folder: str, directory: str) -> None:
    """The folder a file goes in (one of `folders(directory)`), made if missing. Each missing
    level is made with mkdir (0755 above the folder, 0700 for it) and checked with lstat, as
    are `directory` and the folder, so that no level we make, nor the directory we write
    in, is a symlink or anything but a directory (code 5 naming it otherwise)."""
    missing: list[str] = []
    current = os.path.dirname(folder)
    while not os.path.lexists(current):
        missing.append(current)
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    levels = [*((d, 0o755) for d in reversed(missing))]
    if folder != directory and directory not in missing:
        levels.append((directory, 0o755))
    for level, mode in [*levels, (folder, 0o700)]:
        try:
            os.mkdir(level, mode)
            os.chmod(level, mode)  # mkdir's mode goes through the umask
        except FileExistsError:
            pass  # checked below, whatever is there
        except OSError as exc:
            raise CniError(Code.IO_FAILURE, f"cannot create the device-info directory {level} "
                                            f"(deviceInfoDir {directory}): {exc.strerror or exc}") from None
        try:
            st = os.lstat(level)
        except OSError as exc:
            raise CniError(Code.IO_FAILURE, f"cannot check the device-info directory {level}: "
                                            f"{exc.strerror or exc}") from None
        if not stat.S_ISDIR(st.st_mode):
            raise CniError(Code.IO_FAILURE, f"the device-info directory {level} (deviceInfoDir {directory}) "
                                            "is not a directory (a symlink is never followed)")


@dataclass
class Staged:
    """A device-info file written beside its name, not yet linked to it."""

    path: str
    staging: str
    identity: str


def stage(path: str, pci: dict[str, str], directory: str) -> Staged:
    """Write the document for `pci` to the staging file of `path` (a leftover of a crashed
    attempt of this attachment is replaced); the caller records `identity` before `publish`."""
    ensure_directory(os.path.dirname(path), directory)
    doc: dict[str, Any] = {"type": "pci", "version": SPEC_VERSION, "pci": dict(pci)}
    data = json.dumps(doc, indent=2).encode()
    staging = staging_path(path)
    try:
        _unlink_regular(staging)
        fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _OPEN, 0o600)
        try:
            os.write(fd, data)
            # Random nanoseconds: a file another writer makes after this one took the same
            # inode number has the kernel's (tick-grained) time, never this one.
            mtime = time.time_ns() // 1_000_000 * 1_000_000 + 1 + secrets.randbelow(999_998)
            os.utime(fd, ns=(mtime, mtime))
            st = os.fstat(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        _unlink_quietly(staging)
        raise CniError(Code.IO_FAILURE, f"cannot write {FIELD} {path}: {exc.strerror or exc}") from None
    return Staged(path, staging, identity(st))


def publish(staged: Staged) -> bool:
    """Give the staged file its name; False (and nothing changed) if something is there
    already — never replaced. The staging name is removed either way."""
    try:
        os.link(staged.staging, staged.path, follow_symlinks=False)
        return True
    except FileExistsError:
        return False
    except OSError as exc:
        raise CniError(Code.IO_FAILURE, f"cannot write {FIELD} {staged.path}: "
                                        f"{exc.strerror or exc}") from None
    finally:
        _unlink_quietly(staged.staging)


def remove(path: str, recorded: str | None, directory: str) -> bool:
    """Remove the file at `path` only if it is still the one whose identity ADD recorded
    (`recorded`), and a staging leftover of a crashed ADD (its name is tenantnet's alone);
    True if the file at `path` was removed."""
    if confined_problem(path, directory):
        return False
    removed = False
    for candidate, owned in ((staging_path(path), None), (path, recorded)):
        try:
            st = os.lstat(candidate)
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode) or (candidate == path and identity(st) != owned):
            continue
        try:
            os.unlink(candidate)
        except FileNotFoundError:
            continue
        removed = removed or candidate == path
    return removed


def confined_problem(path: str, directory: str) -> bool:
    """True unless `path` is a plain path directly in one of `folders(directory)`."""
    try:
        confined(FIELD, path, (directory,), "a file")
    except CniError:
        return True
    return os.path.dirname(path) not in folders(directory)


def _unlink_regular(path: str) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode):
        raise OSError(errno.EEXIST, "a staging name is taken by something that is not a regular file", path)
    os.unlink(path)


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
