"""Files on the host that a caller's input names: confined, bounded, never blocking.

A network config is tenant input (docs/security.md), yet some of its fields are paths the
plugin opens as root: an ovs-cni `configuration_path`, host-local's `resolvConf` and
`dataDir`, Multus's `CNIDeviceInfoFile`, a NAD's `logFile`. Every such path goes through
here: it must be a plain absolute path (no `..`, `.`, `//`, NUL, trailing `/`) equal to or
below one of the directories the admin allows, and the file itself is opened with
`O_NOFOLLOW | O_NONBLOCK` and checked to be a regular file before a byte is read or written
— so a symlink, FIFO, device or directory is refused without blocking, and a read stops at
a bound. A layer of its own between `cni/` (which stays pure) and `ipam/` + the plugin
wing, because both plugins of the project (the main one and the IPAM one) need exactly the
same rules.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
from collections.abc import Iterable

from cni.errors import CniError, Code, invalid_config

MAX_FILE_BYTES = 64 << 10
_OPEN_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY


def plain_path_problem(path: object) -> str | None:
    """Why `path` is not a plain absolute path, or None."""
    if not isinstance(path, str) or not path:
        return "must be an absolute path string"
    if "\0" in path or any(ord(c) < 0x20 or ord(c) == 0x7F for c in path):
        return "must not contain NUL or control characters"
    if not path.startswith("/"):
        return "must be an absolute path"
    if os.path.normpath(path) != path or path.startswith("//"):
        return "must be a plain path (no '..', '.', '//' or trailing '/')"
    return None


def within(path: str, allowed: Iterable[str]) -> bool:
    """Is the plain path `path` equal to or below one of `allowed`?"""
    for root in allowed:
        root = root.rstrip("/") or "/"
        if path == root or path.startswith(root + "/") or root == "/":
            return True
    return False


def confined(field: str, path: object, allowed: Iterable[str], what: str) -> str:
    """`path` checked to be plain and inside `allowed` (code 7 naming `field` otherwise)."""
    allowed = tuple(allowed)
    problem = plain_path_problem(path)
    if problem:
        raise invalid_config(field, path, problem)
    assert isinstance(path, str)
    if not within(path, allowed):
        listed = ", ".join(allowed) or "none configured"
        raise invalid_config(field, path, f"must be {what} inside one of the node config's allowed "
                                          f"directories ({listed})")
    return path


def _no_symlinked_parents(field: str, path: str, root: str) -> None:
    """Every directory between `root` and `path` must be a real directory, not a symlink.

    O_NOFOLLOW guards only the last component; the directories below an allowed root are
    the admin's, but a path through a symlink someone left there must not lead outside."""
    parent = os.path.dirname(path)
    while within(parent, (root,)) and parent != root.rstrip("/"):
        try:
            st = os.lstat(parent)
        except FileNotFoundError:
            parent = os.path.dirname(parent)
            continue
        except OSError as exc:
            raise invalid_config(field, path, f"cannot be checked: {exc.strerror}") from None
        if not stat.S_ISDIR(st.st_mode):
            raise invalid_config(field, path, f"goes through {parent}, which is not a directory")
        parent = os.path.dirname(parent)


def confined_dir(field: str, path: object, allowed: Iterable[str]) -> str:
    """A directory path inside `allowed` that leads through no symlink: the directory itself,
    if it exists, and every one between it and its allowed root are real directories."""
    allowed = tuple(allowed)
    checked = confined(field, path, allowed, "a directory")
    _no_symlinked_parents(field, checked, _root_of(checked, allowed))
    try:
        st = os.lstat(checked)
    except FileNotFoundError:
        return checked
    except OSError as exc:
        raise invalid_config(field, checked, f"cannot be checked: {exc.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise invalid_config(field, checked, "exists and is not a directory (a symlink is never followed)")
    return checked


def _root_of(path: str, allowed: Iterable[str]) -> str:
    return max((r for r in allowed if within(path, (r,))), key=len, default="/")


def read_confined(field: str, path: object, allowed: Iterable[str], what: str = "a file",
                  *, limit: int = MAX_FILE_BYTES, missing_ok: bool = False) -> bytes | None:
    """The bytes of a regular file at a confined path, at most `limit` of them."""
    allowed = tuple(allowed)
    checked = confined(field, path, allowed, what)
    _no_symlinked_parents(field, checked, _root_of(checked, allowed))
    try:
        fd = os.open(checked, os.O_RDONLY | _OPEN_FLAGS)
    except FileNotFoundError:
        if missing_ok:
            return None
        raise invalid_config(field, checked, "does not exist") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise invalid_config(field, checked, "is a symbolic link; name the file itself") from None
        raise invalid_config(field, checked, f"cannot be read: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise invalid_config(field, checked, "is not a regular file")
        if st.st_size > limit:
            raise invalid_config(field, checked, f"is {st.st_size} bytes; at most {limit} allowed")
        chunks, left = [], limit + 1
        while left > 0:
            chunk = os.read(fd, left)
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) > limit:
            raise invalid_config(field, checked, f"is larger than {limit} bytes")
        return data
    except OSError as exc:
        raise invalid_config(field, checked, f"cannot be read: {exc.strerror}") from None
    finally:
        os.close(fd)


def ensure_private_dir(path: str, stop_at: str | None = None, mode: int = 0o700) -> None:
    """Create `path` and any missing parents with `mode`, 0700 unless told (below `stop_at`, if
    given, the parents must exist already); existing ones are left as they are. makedirs'
    `mode` applies only to the last level, and the umask filters it: each level is created and
    then chmodded here. A level that exists and is not a directory: FileExistsError naming it."""
    missing = []
    current = path
    while not os.path.isdir(current):
        if stop_at is not None and not within(current, (stop_at,)):
            raise FileNotFoundError(errno.ENOENT, "directory does not exist", current)
        missing.append(current)
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, mode)
        except FileExistsError:
            if not os.path.isdir(directory):
                raise
            continue
        os.chmod(directory, mode)


def open_for_append(path: str, mode: int = 0o640) -> int:
    """A file descriptor appending to the regular file `path` (created with `mode`), or
    OSError: never follows a symlink, never blocks on a FIFO, never opens a device."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | _OPEN_FLAGS, mode)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_confined(field: str, path: object, allowed: Iterable[str], data: bytes, *,
                   mode: int = 0o600, what: str = "a file") -> str:
    """Replace the file at a confined path atomically (temp file + rename) with `data`.

    Missing directories below the allowed root are created 0700; an existing target must be
    a regular file (a symlink or anything else there is refused)."""
    allowed = tuple(allowed)
    checked = confined(field, path, allowed, what)
    root = _root_of(checked, allowed)
    _no_symlinked_parents(field, checked, root)
    try:
        st = os.lstat(checked)
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISREG(st.st_mode):
            raise invalid_config(field, checked, "exists and is not a regular file")
    tmp = f"{checked}.tmp.{os.getpid()}"
    try:
        ensure_private_dir(os.path.dirname(checked), stop_at=root)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _OPEN_FLAGS, mode)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, checked)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise CniError(Code.IO_FAILURE, f"cannot write {field} {checked}: {exc.strerror or exc}") from None
    return checked


def remove_confined(path: str, allowed: Iterable[str]) -> bool:
    """Remove a regular file (never what a symlink points to) at a confined path; False if
    it is absent, not plain, not inside `allowed`, or not a regular file."""
    if plain_path_problem(path) or not within(path, tuple(allowed)):
        return False
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return False
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


def replace_file(path: str, data: bytes, mode: int = 0o600) -> None:
    """Write `path` whole or not at all: a temp file beside it, named for this process and
    thread (several may write one path, each under its own lock or not), created exclusively
    and never through a link, given exactly `mode`, then renamed over `path`. No fsync: a
    reader or a process after a SIGKILL sees the old file or the new one, never a part."""
    tmp = f"{path}.tmp.{os.getpid()}.{threading.get_ident()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, mode)
    try:
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), mode)  # the umask narrowed os.open's
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
