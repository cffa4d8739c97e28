"""tenantnet's self-contained runtime and the shims that run it: what `tenantnetctl install`
places on a node, and what `packaging/build_runtime.py` builds (it imports this module from
the runtime being built, so build and installer share one definition of the manifest
digest and the shim text).

A runtime directory carries an interpreter, its standard library, tenantnet and its
dependencies, every shared library they load, a static busybox and a manifest
(`tenantnet-runtime.json`) listing every file's sha256 and a digest of the whole tree. It
is copied durably and never modified once in place. A shim is a small script interpreted by
the runtime's busybox that execs the runtime's own loader on its interpreter.

Standard library only: this module runs at image build time and from the runtime itself.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import stat
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MANIFEST = "tenantnet-runtime.json"
PLUGINS: tuple[str, ...] = ("tenantnet", "tenantnet-ipam")
DEFAULT_CNI_BIN_DIR = "/opt/cni/bin"
DEFAULT_RUNTIME_DIR = "/opt/tenantnet"
# Every temporary file or directory the installer creates starts with this: a crash leaves
# at most such names behind (never a half-written `tenantnet`), and the next run removes them.
TMP_PREFIX = ".tenantnet-tmp-"
SHIM_MARK = "# tenantnet-shim"
SHIM_MODE = 0o755
NODE_CONFIG_MODE = 0o644
# Kernels before 5.1 read only the first 127 bytes of a `#!` line.
MAX_SHEBANG = 127

SHIM_TEMPLATE = """\
#!{rt}/{shell}
{mark} {command}: written by `tenantnetctl install`; replaced on upgrade, removed by --uninstall.
# runtime: {rt}
# tenantnet {version}, runtime digest {digest}
# The runtime's own loader, glibc and Python run here: the host's are never used.
LC_ALL=C exec "{rt}/{loader}" --inhibit-cache --library-path "{rt}/lib" \\
    "{rt}/{python}" -I -S -B -X utf8 "{rt}/{entry}" "$@"
"""

_SHIM_RUNTIME = re.compile(r"^# runtime: (/\S+)$", re.MULTILINE)
_SAFE_PATH = re.compile(r"^/[A-Za-z0-9._+@/-]*$")

Out = Callable[[str], None]


class InstallError(Exception):
    """A refusal or failure, with a message for the operator."""


# ---------------------------------------------------------------------------- the runtime


def tree_digest(root: Path) -> tuple[str, list[dict[str, Any]]]:
    """Content digest of a runtime tree (all but the manifest) and its file list.

    The same function builds the manifest (packaging/build_runtime.py imports it) and checks
    a copy, so the two can never disagree on what "the same runtime" means.
    """
    entries: list[dict[str, Any]] = []
    for dirpath, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(files):
            path = Path(dirpath, name)
            rel = path.relative_to(root).as_posix()
            if rel == MANIFEST:
                continue
            st = path.lstat()
            if stat.S_ISLNK(st.st_mode):
                entries.append({"path": rel, "link": os.readlink(path)})
                continue
            h = hashlib.sha256()
            with open(path, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    h.update(chunk)
            entries.append({"path": rel, "mode": stat.S_IMODE(st.st_mode), "sha256": h.hexdigest()})
    digest = hashlib.sha256()
    for e in entries:
        digest.update(json.dumps(e, sort_keys=True).encode() + b"\n")
    return digest.hexdigest(), entries


@dataclass(frozen=True)
class Runtime:
    """A runtime directory and its manifest."""

    path: Path
    manifest: dict[str, Any] = field(repr=False)

    @property
    def version(self) -> str:
        return str(self.manifest["version"])

    @property
    def digest(self) -> str:
        return str(self.manifest["digest"])

    @property
    def name(self) -> str:
        """Directory name on the host: readable, and different for every different build."""
        return f"{self.version}-{self.digest[:12]}"

    @property
    def trampoline(self) -> str | None:
        """The compiled trampoline in the runtime (relative path), if the build had a compiler."""
        value = self.manifest.get("trampoline")
        return str(value) if value else None

    def entry(self, command: str) -> str:
        entries: dict[str, str] = self.manifest["entrypoints"]
        if command not in entries:
            raise InstallError(f"runtime {self.path} has no command {command!r}; "
                               f"it has: {', '.join(entries)}")
        return entries[command]


def load_runtime(path: Path) -> Runtime:
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except FileNotFoundError:
        raise InstallError(f"{path} is not a tenantnet runtime: no {MANIFEST} in it") from None
    except (OSError, ValueError) as exc:
        raise InstallError(f"cannot read {path / MANIFEST}: {exc}") from None
    keys = ("version", "digest", "loader", "python", "shell", "entrypoints")
    missing = [k for k in keys if k not in manifest]
    if missing:
        raise InstallError(f"{path / MANIFEST} lacks {', '.join(missing)}")
    if not _SAFE_PATH.match("/" + str(manifest["version"])):
        raise InstallError(f"{path / MANIFEST}: unusable version {manifest['version']!r}")
    return Runtime(path, manifest)


def default_runtime_source() -> Path | None:
    """The runtime this installer itself runs from, if it runs from one (the image's)."""
    prefix = Path(sys.prefix)
    return prefix if (prefix / MANIFEST).is_file() else None


def verify(runtime: Runtime, path: Path | None = None) -> bool:
    """Whether the tree at `path` (default: the runtime's own) matches the runtime's manifest."""
    digest, _ = tree_digest(path or runtime.path)
    return digest == runtime.digest


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _copy_tree_durably(src: Path, dst: Path) -> int:
    """Copy src to the new directory dst; every file and directory fsynced. Returns files copied."""
    count = 0
    dirs_made: list[Path] = []
    for dirpath, dirs, files in os.walk(src):
        rel = Path(dirpath).relative_to(src)
        target_dir = dst / rel
        target_dir.mkdir(mode=0o755)
        dirs_made.append(target_dir)
        for name in sorted(dirs + files):
            s, d = Path(dirpath, name), target_dir / name
            if s.is_symlink():
                os.symlink(os.readlink(s), d)
                if name in dirs:
                    dirs.remove(name)  # never walk out of the runtime through a link
            elif name in files:
                shutil.copy2(s, d, follow_symlinks=False)
                with open(d, "rb") as fh:
                    os.fsync(fh.fileno())
                count += 1
    for d in reversed(dirs_made):
        fsync_dir(d)
    return count


def remove_tree(path: Path) -> None:
    """Remove a runtime directory by renaming it aside first: its name disappears at once."""
    aside = path.parent / f"{TMP_PREFIX}old-{path.name}-{os.getpid()}"
    os.rename(path, aside)
    shutil.rmtree(aside)


def place_runtime(src: Runtime, runtime_dir: Path, out: Out, host_path: str) -> bool:
    """Copy the runtime to runtime_dir/<name> unless a verified copy is there. Returns changed."""
    dest = runtime_dir / src.name
    if dest.is_dir():
        try:
            there = load_runtime(dest)
            intact = there.digest == src.digest and verify(there)
        except InstallError:
            intact = False
        if intact:
            out(f"runtime {host_path}: already installed (verified)")
            return False
        out(f"runtime {host_path}: present but does not match its manifest; replacing it")
    if not verify(src):
        raise InstallError(f"source runtime {src.path} does not match its own manifest; refusing to copy it")
    tmp = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{src.name}-", dir=runtime_dir))
    tmp.rmdir()  # _copy_tree_durably creates it (mkdtemp only reserved a unique name)
    try:
        count = _copy_tree_durably(src.path, tmp)
        if not verify(src, tmp):
            raise InstallError(f"the copy of the runtime in {tmp} does not match the manifest "
                               "(disk or copy error)")
        if dest.exists():
            remove_tree(dest)
        os.rename(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    fsync_dir(runtime_dir)
    out(f"runtime {host_path}: installed ({count} files, verified against its manifest)")
    return True


# ------------------------------------------------------------------------------- the shims


def shim_text(runtime: Runtime, host_runtime_path: str, command: str) -> str:
    """The executable written as `command`: run `command` from the runtime at host_runtime_path."""
    if not _SAFE_PATH.match(host_runtime_path):
        # it goes on a `#!` line (no spaces possible) and into shell words
        raise InstallError(f"runtime path {host_runtime_path!r}: use an absolute path of "
                           "letters, digits and ._+@-")
    m = runtime.manifest
    shebang = f"#!{host_runtime_path}/{m['shell']}"
    if len(shebang) > MAX_SHEBANG:
        raise InstallError(f"runtime path {host_runtime_path!r} is too long for a #! line "
                           f"({len(shebang)} > {MAX_SHEBANG} characters)")
    return SHIM_TEMPLATE.format(rt=host_runtime_path, shell=m["shell"], mark=SHIM_MARK, command=command,
                                version=runtime.version, digest=runtime.digest, loader=m["loader"],
                                python=m["python"], entry=runtime.entry(command))


# The plugin executables, where the runtime has a compiled trampoline (trampoline/trampoline.c,
# docs/agent.md): `<command>` is that static binary, and `<command>-shim` the script above,
# which the trampoline execs for everything but the agent's fast path (it finds it in its own
# directory). Without a trampoline `<command>` is the script too. The -shim is written first:
# a trampoline is never in place without its fallback.
SHIM_SUFFIX = "-shim"
# A string only the trampoline binary holds (the variable it hands failures over in).
TRAMPOLINE_MARK = b"TENANTNET_SHIM_FAILURE"
MAX_TRAMPOLINE = 16 << 20


def plugin_files(runtime: Runtime, host_runtime_path: str, command: str) -> list[tuple[str, bytes]]:
    """(file name, content) the installer writes for `command`, in the order it writes them."""
    script = shim_text(runtime, host_runtime_path, command).encode()
    if command not in PLUGINS:
        return [(command, script)]
    main = (runtime.path / runtime.trampoline).read_bytes() if runtime.trampoline else script
    return [(command + SHIM_SUFFIX, script), (command, main)]


def is_trampoline(path: Path) -> bool:
    """Whether `path` is a regular file holding the compiled trampoline (of any build)."""
    try:
        st = path.lstat()
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_TRAMPOLINE:
            return False
        data = path.read_bytes()
    except OSError:
        return False
    return data[:4] == b"\x7fELF" and TRAMPOLINE_MARK in data


def written_by_us(path: Path) -> bool:
    """A shim script or a trampoline this installer wrote (anything else is left alone)."""
    return shim_runtime(path) is not None or is_trampoline(path)


def installed_runtime(bin_dir: Path, command: str) -> str | None:
    """The runtime path an installed `command` runs: its shim's, or for a trampoline, the
    runtime its `-shim` names. None if it is not ours (or a trampoline without its -shim)."""
    rt = shim_runtime(bin_dir / command)
    if rt is None and command in PLUGINS and is_trampoline(bin_dir / command):
        rt = shim_runtime(bin_dir / (command + SHIM_SUFFIX))
    return rt


VENV_LAUNCHER = """\
#!{python} -IS
# {command}: written by `make venv` for this checkout's venv. It starts as the installed
# shim does (-I -S: no site-packages scan on the fast path); the in-process fallback loads
# site-packages itself (tenantnet/entry/shim.py).
import sys
sys.path.insert(0, {root!r})
from {module} import main
main()
"""
# The plugin executables' entry modules (their `main` runs the shim with their fallback).
PLUGIN_ENTRIES = {"tenantnet": "tenantnet.entry.plugin", "tenantnet-ipam": "tenantnet.entry.ipam"}


def write_venv_launchers(bin_dir: Path, root: Path, commands: tuple[str, ...] = PLUGINS,
                         suffix: str = "") -> None:
    """Replace pip's console scripts of the plugins in a development venv by lean launchers
    (pip's start the interpreter with site, ≈ 12 ms more per exec here). With `suffix`
    "-shim" they are the Python fallback the compiled trampoline execs (`make venv` writes
    both: `<command>-shim` always, `<command>` itself only when no C compiler built the
    trampoline)."""
    python = bin_dir / "python"
    for command in commands:
        text = VENV_LAUNCHER.format(python=python, root=str(root), command=command + suffix,
                                    module=PLUGIN_ENTRIES[command])
        atomic_write(bin_dir / (command + suffix), text.encode(), SHIM_MODE)


def shim_runtime(path: Path) -> str | None:
    """The runtime path a shim written by this installer names; None if `path` is not one."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(4096)
    except (FileNotFoundError, IsADirectoryError):
        return None
    return shim_runtime_text(head.decode("utf-8", "replace"))


def shim_runtime_text(text: str) -> str | None:
    """The runtime path named by shim text, None if it is not a shim of this installer."""
    if SHIM_MARK not in text:
        return None
    m = _SHIM_RUNTIME.search(text)
    return m.group(1) if m else None


def atomic_write(path: Path, data: bytes, mode: int) -> bool:
    """Write `path` so that a reader sees the old file or the whole new one, never a part.

    Temp file in the same directory (same filesystem, so rename is atomic), mode set and
    data fsynced before the rename, directory fsynced after (the rename survives a crash).
    Returns False, touching nothing, when the file already has exactly this content and mode.
    """
    try:
        st = path.lstat()
        if stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == mode and path.read_bytes() == data:
            return False
    except FileNotFoundError:
        pass
    fd, tmp = tempfile.mkstemp(prefix=f"{TMP_PREFIX}{path.name}-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fchmod(fh.fileno(), mode)
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)
    return True
