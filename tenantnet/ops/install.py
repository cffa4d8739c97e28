"""`tenantnetctl install`: put tenantnet on a node so kubelet and Multus can exec it.

kubelet (through the container runtime's libcni, or Multus) execs `/opt/cni/bin/tenantnet`
on the host, outside any container. The host may have no Python, another Python, another
glibc, or no shell. So nothing of the host is used:

* The image carries a self-contained **runtime** directory (built by
  `packaging/build_runtime.py`): a CPython interpreter, its standard library, tenantnet and
  its dependencies, every shared library they load *including glibc and its dynamic loader*,
  and a static busybox. A manifest (`tenantnet-runtime.json`) lists every file with its
  sha256 and a digest of the whole tree.
* The installer copies it to `<runtime-dir>/<version>-<digest[:12]>` (default
  `/opt/tenantnet/…`): into a temporary directory beside it, every file fsynced, the copy
  checked against the manifest, then renamed into place. A runtime directory is never
  modified once there: a new build gets a new name, so a running plugin never sees files
  change under it.
* Then it writes `tenantnet` and `tenantnet-ipam` into the CNI binary directory: small
  scripts ("shims") interpreted by the runtime's static busybox, which exec the runtime's
  loader on its interpreter. Each is written atomically (temp file in the same directory,
  fsync, rename), so kubelet runs the old shim or the new one, never half of one; the
  runtime is in place before any shim names it. When the runtime has the compiled
  trampoline (docs/agent.md), the scripts are written as `tenantnet-shim` and
  `tenantnet-ipam-shim` first, then `tenantnet` and `tenantnet-ipam` as the trampoline,
  which execs its `-shim` beside it for everything but the agent's fast path. Without one,
  the `-shim` files are written too (the same script as the plain name).

Nothing else is written unless asked: `--node-config FILE` also writes the node config
(validated first). `--uninstall` removes the shims it wrote and the runtimes, nothing else
(records in /var/lib/tenantnet and logs stay; `--remove-node-config` removes the node
config). `--status` checks an installation (the DaemonSet's readiness probe).

Inside the DaemonSet the host's directories are mounted under `--host-root` (e.g. /host):
files are written there, while the shims name the paths as the host sees them.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import shutil
import signal
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tenantnet.ops.runtime import (
    DEFAULT_CNI_BIN_DIR,
    DEFAULT_RUNTIME_DIR,
    MANIFEST,
    NODE_CONFIG_MODE,
    PLUGINS,
    SHIM_MODE,
    SHIM_SUFFIX,
    TMP_PREFIX,
    InstallError,
    Out,
    Runtime,
    atomic_write,
    default_runtime_source,
    fsync_dir,
    installed_runtime,
    is_trampoline,
    load_runtime,
    place_runtime,
    plugin_files,
    remove_tree,
    written_by_us,
)
from tenantnet.plugin import nodepath

# --------------------------------------------------------------------------- the commands


@dataclass
class Options:
    """Where things go. Paths are as the host sees them; files are written under host_root."""

    host_root: Path = Path("/")
    cni_bin_dir: str = DEFAULT_CNI_BIN_DIR
    runtime_dir: str = DEFAULT_RUNTIME_DIR
    runtime_src: Path | None = None
    in_place: bool = False
    commands: tuple[str, ...] = PLUGINS
    node_config: Path | None = None
    node_config_dest: str = nodepath.DEFAULT_PATH
    remove_node_config: bool = False

    def under_root(self, host_path: str) -> Path:
        if not host_path.startswith("/"):
            raise InstallError(f"{host_path!r}: host paths must be absolute")
        return self.host_root / host_path.lstrip("/")


def _existing_dir(opts: Options, host_path: str, what: str, hint: str) -> Path:
    path = opts.under_root(host_path)
    if not path.is_dir():
        shown = host_path if opts.host_root == Path("/") else f"{host_path} (looked for {path})"
        raise InstallError(f"{what} {shown} does not exist; {hint}")
    return path


def _bin_dir(opts: Options) -> Path:
    return _existing_dir(
        opts, opts.cni_bin_dir, "CNI binary directory",
        "refusing to create it: kubelet would not look there. Pass the directory your container "
        "runtime uses (containerd: bin_dir in /etc/containerd/config.toml; CRI-O: plugin_dirs in "
        "crio.conf; k3s: /var/lib/rancher/k3s/data/current/bin) with --cni-bin-dir")


def _runtime_dir(opts: Options) -> Path:
    return _existing_dir(opts, opts.runtime_dir, "runtime directory",
                         "create it (mkdir -p), or mount it with hostPath type DirectoryOrCreate")


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """One installer at a time per node (an init container and an operator, say)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _source(opts: Options) -> Runtime:
    src = opts.runtime_src or default_runtime_source()
    if src is None:
        raise InstallError("not running from a packaged runtime: pass --runtime-src DIR "
                           "(a directory built by packaging/build_runtime.py)")
    return load_runtime(src.resolve())


def _runtime_host_path(opts: Options, name: str) -> str:
    return opts.runtime_dir.rstrip("/") + "/" + name


def _ours(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink() and (path / MANIFEST).is_file()


def install(opts: Options, out: Out = print) -> bool:
    """Install (or repair) tenantnet on the node. Returns whether anything changed."""
    bin_dir = _bin_dir(opts)
    src = _source(opts)
    node_config_text: bytes | None = None
    if opts.node_config is not None:
        node_config_text = _validated_node_config(opts.node_config)
        node_config_path = opts.under_root(opts.node_config_dest)
        if not node_config_path.parent.is_dir():
            raise InstallError(f"node config directory {Path(opts.node_config_dest).parent} does not exist "
                               f"(looked for {node_config_path.parent}); create it or mount it")
    changed = False
    if opts.in_place:
        # the runtime stays where it is (an unpacked tarball, or the image's own launchers)
        host_rt = str(src.path)
        runtime_dir = None
    else:
        runtime_dir = _runtime_dir(opts)
        host_rt = _runtime_host_path(opts, src.name)
    with _locked(runtime_dir or bin_dir):
        previous = {installed_runtime(bin_dir, c) for c in opts.commands} - {None}
        changed |= _remove_temp_files(bin_dir)
        if runtime_dir is not None:
            changed |= place_runtime(src, runtime_dir, out, host_rt)
        # shims only after the runtime they name is complete and in place (and a trampoline
        # only after the -shim it falls back to)
        for command in opts.commands:
            for name, data in plugin_files(src, host_rt, command):
                target = bin_dir / name
                host_target = opts.cni_bin_dir.rstrip("/") + "/" + name
                foreign = (target.exists() or target.is_symlink()) and not written_by_us(target)
                if atomic_write(target, data, SHIM_MODE):
                    changed = True
                    note = " (replaced a file not written by this installer)" if foreign else ""
                    kind = " (the compiled trampoline)" if data[:4] == b"\x7fELF" else ""
                    out(f"{host_target}: written{kind}, runs tenantnet {src.version} from {host_rt}{note}")
                else:
                    out(f"{host_target}: unchanged")
        if node_config_text is not None:
            if atomic_write(node_config_path, node_config_text, NODE_CONFIG_MODE):
                changed = True
                out(f"{opts.node_config_dest}: written from {opts.node_config}")
            else:
                out(f"{opts.node_config_dest}: unchanged")
        if runtime_dir is not None:
            keep = {src.name} | {Path(p).name for p in previous if Path(p).parent == Path(opts.runtime_dir)}
            changed |= _prune(runtime_dir, keep, opts, out)
    if not changed:
        out("nothing changed: tenantnet is installed")
    return changed


def _remove_temp_files(directory: Path) -> bool:
    """Remove temp files a crashed run of ours left (ours by their prefix, nobody else's)."""
    found = False
    for entry in directory.iterdir():
        if entry.name.startswith(TMP_PREFIX) and entry.is_file():
            entry.unlink()
            found = True
    return found


def _prune(runtime_dir: Path, keep: set[str], opts: Options, out: Out) -> bool:
    """Remove leftovers of crashed runs and runtimes older than the one just replaced.

    The runtime the shims named before this run is kept: a plugin exec'd a moment ago may
    still be importing from it.
    """
    changed = False
    for entry in sorted(runtime_dir.iterdir()):
        if entry.name.startswith(TMP_PREFIX):
            shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink()
            changed = True
        elif entry.name not in keep and _ours(entry):
            remove_tree(entry)
            out(f"runtime {_runtime_host_path(opts, entry.name)}: removed (superseded)")
            changed = True
    return changed


def _validated_node_config(path: Path) -> bytes:
    """The node config file's bytes, if tenantnet itself accepts it: a broken one never lands."""
    from cni.errors import CniError
    from tenantnet.plugin import nodeconfig as config

    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InstallError(f"cannot read node config {path}: {exc.strerror}") from None
    try:
        config.load(str(path))
    except CniError as err:
        raise InstallError(f"refusing to install the node config: {err.msg}") from None
    return data


def uninstall(opts: Options, out: Out = print) -> bool:
    """Remove what install wrote: our shims, our runtimes (and the node config if asked)."""
    bin_dir = _bin_dir(opts)
    runtime_dir = None if opts.in_place else _runtime_dir(opts)
    changed = False
    with _locked(runtime_dir or bin_dir):
        for command in opts.commands:
            # the trampoline before the -shim it falls back to
            for name in (command, command + SHIM_SUFFIX) if command in PLUGINS else (command,):
                target = bin_dir / name
                host_target = opts.cni_bin_dir.rstrip("/") + "/" + name
                if written_by_us(target):
                    target.unlink()
                    out(f"{host_target}: removed")
                    changed = True
                elif target.exists() or target.is_symlink():
                    out(f"{host_target}: left in place (not written by this installer)")
        changed |= _remove_temp_files(bin_dir)
        if changed:
            fsync_dir(bin_dir)
        if runtime_dir is not None:
            for entry in sorted(runtime_dir.iterdir()):
                if entry.name.startswith(TMP_PREFIX) or _ours(entry):
                    remove_tree(entry)
                    if not entry.name.startswith(TMP_PREFIX):
                        out(f"runtime {_runtime_host_path(opts, entry.name)}: removed")
                    changed = True
        if opts.remove_node_config:
            path = opts.under_root(opts.node_config_dest)
            if path.is_file():
                path.unlink()
                out(f"{opts.node_config_dest}: removed")
                changed = True
    if not changed:
        out("nothing to remove: tenantnet is not installed")
    return changed


def status(opts: Options, out: Out = print) -> bool:
    """Whether every shim is ours and names a complete runtime. Cheap: no hashing."""
    bin_dir = _bin_dir(opts)
    ok = True
    for command in opts.commands:
        host_target = opts.cni_bin_dir.rstrip("/") + "/" + command
        trampoline = command in PLUGINS and is_trampoline(bin_dir / command)
        rt = installed_runtime(bin_dir, command)
        if rt is None:
            out(f"{host_target}: the trampoline, but {host_target}{SHIM_SUFFIX} is missing or not "
                "written by this installer" if trampoline
                else f"{host_target}: missing or not written by this installer")
            ok = False
            continue
        try:
            runtime = load_runtime(opts.under_root(rt))
            needed = [runtime.manifest[k] for k in ("loader", "python", "shell")] + [runtime.entry(command)]
            absent = [p for p in needed if not (runtime.path / p).exists()]
        except InstallError as exc:
            out(f"{host_target}: its runtime {rt} is unusable: {exc}")
            ok = False
            continue
        if absent:
            out(f"{host_target}: its runtime {rt} lacks {', '.join(absent)}")
            ok = False
        elif not all(os.access(p, os.X_OK) for p in
                     [bin_dir / command] + ([bin_dir / (command + SHIM_SUFFIX)] if trampoline else [])):
            out(f"{host_target}: not executable")
            ok = False
        elif trampoline and (runtime.trampoline is None or (bin_dir / command).read_bytes()
                             != (runtime.path / runtime.trampoline).read_bytes()):
            out(f"{host_target}: a trampoline that is not its runtime {rt}'s")
            ok = False
        else:
            kind = " (compiled trampoline)" if trampoline else ""
            out(f"{host_target}: ok{kind}, tenantnet {runtime.version} from {rt}")
    return ok


# ---------------------------------------------------------------------------------- CLI


def add_arguments(p: argparse.ArgumentParser) -> None:
    what = p.add_mutually_exclusive_group()
    what.add_argument("--uninstall", action="store_true",
                      help="remove the shims this installer wrote and the runtimes (not the state in "
                           "/var/lib/tenantnet, not logs); remove pods using tenantnet networks first")
    what.add_argument("--status", action="store_true",
                      help="check the installation (exit 1 if a shim is missing or its runtime incomplete)")
    p.add_argument("--host-root", type=Path, default=Path("/"), metavar="DIR",
                   help="where the host's directories are mounted (in the DaemonSet: /host); "
                        "paths below are host paths (default /)")
    p.add_argument("--cni-bin-dir", default=DEFAULT_CNI_BIN_DIR, metavar="DIR",
                   help=f"the directory kubelet/the runtime runs CNI plugins from; must exist "
                        f"(default {DEFAULT_CNI_BIN_DIR})")
    p.add_argument("--runtime-dir", default=DEFAULT_RUNTIME_DIR, metavar="DIR",
                   help=f"where runtimes are copied to, as <version>-<digest>; must exist "
                        f"(default {DEFAULT_RUNTIME_DIR})")
    p.add_argument("--runtime-src", type=Path, metavar="DIR",
                   help="the runtime to install (default: the one this installer runs from)")
    p.add_argument("--in-place", action="store_true",
                   help="do not copy the runtime: shims name --runtime-src where it is")
    p.add_argument("--commands", default=",".join(PLUGINS), metavar="LIST",
                   help=f"commands to write shims for (default {','.join(PLUGINS)}; the runtime "
                        "also has tenantnetctl and tenantnet-install)")
    # dest differs from tenantnetctl's global --node-config (which node config to *use*)
    p.add_argument("--node-config", type=Path, metavar="FILE", dest="install_node_config",
                   help="also write this node config (validated first) to --node-config-dest; "
                        "without it the node config is never touched")
    p.add_argument("--node-config-dest", default=nodepath.DEFAULT_PATH, metavar="PATH",
                   help=f"host path of the node config (default {nodepath.DEFAULT_PATH})")
    p.add_argument("--remove-node-config", action="store_true",
                   help="with --uninstall: also remove the node config")
    p.add_argument("--wait", action="store_true",
                   help="afterwards, stay running until SIGTERM (the DaemonSet's resident container)")


def options_from(args: argparse.Namespace) -> Options:
    commands = tuple(c for c in args.commands.split(",") if c)
    return Options(host_root=args.host_root, cni_bin_dir=args.cni_bin_dir, runtime_dir=args.runtime_dir,
                   runtime_src=args.runtime_src, in_place=args.in_place, commands=commands,
                   node_config=args.install_node_config, node_config_dest=args.node_config_dest,
                   remove_node_config=args.remove_node_config)


def run(args: argparse.Namespace) -> int:
    """Handler of `tenantnetctl install`: 0 done (or status ok), 1 refused/failed/not ok, 2 usage."""
    if args.remove_node_config and not args.uninstall:
        print("tenantnet install: --remove-node-config goes with --uninstall", file=sys.stderr)
        return 2
    if args.install_node_config and (args.uninstall or args.status):
        print("tenantnet install: --node-config goes with an install", file=sys.stderr)
        return 2
    if args.in_place and (args.runtime_src is None or args.host_root != Path("/")):
        # the shims name the runtime where it is, so that must be a path the host sees
        print("tenantnet install: --in-place needs --runtime-src and no --host-root", file=sys.stderr)
        return 2
    opts = options_from(args)
    if args.wait:
        # blocked from the start, so a SIGTERM arriving before sigwait() is kept pending
        signal.pthread_sigmask(signal.SIG_BLOCK, _WAIT_SIGNALS)
    try:
        if args.status:
            code = 0 if status(opts) else 1
        elif args.uninstall:
            uninstall(opts)
            code = 0
        else:
            install(opts)
            code = 0
    except InstallError as exc:
        print(f"tenantnet install: {exc}", file=sys.stderr)
        code = 1
    except OSError as exc:
        print(f"tenantnet install: {exc}", file=sys.stderr)
        code = 1
    sys.stdout.flush()
    if args.wait and code == 0:
        _wait_for_termination()
    return code


_WAIT_SIGNALS = {signal.SIGTERM, signal.SIGINT}


def _wait_for_termination() -> None:
    """Block until SIGTERM or SIGINT, doing nothing (no polling, no re-install)."""
    signal.sigwait(_WAIT_SIGNALS)


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add `install` to an argparse subparsers object (tenantnetctl's)."""
    p = subparsers.add_parser(
        "install", help="install tenantnet into /opt/cni/bin (or uninstall, or check)",
        description=__doc__.split("\n\n")[0] + " See docs/install.md.")
    add_arguments(p)
    p.set_defaults(func=run)
    return p


def main(argv: list[str] | None = None) -> int:
    """`tenantnet-install` (the image's entry point) and `python -m tenantnet.ops.install`."""
    p = argparse.ArgumentParser(prog="tenantnet-install", description=__doc__.split("\n\n")[0])
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
