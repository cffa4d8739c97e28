#!/usr/bin/env python3
"""Build tenantnet's self-contained runtime: one directory that runs on any Linux host.

kubelet and Multus exec `/opt/cni/bin/tenantnet` on the *host*, where there may be no
Python, another Python, another glibc, or no shell at all. So the image carries the whole
runtime in one relocatable directory, and the installer copies that directory to the host:

    bin/python3.11              the interpreter of the image's Debian, unmodified
    bin/busybox, bin/sh -> busybox
                                a *static* shell: the interpreter of the `#!` line of the shims
                                the installer writes, so the host needs no shell of its own
    lib/ld-linux-*.so.*         the dynamic loader and every shared library the interpreter,
    lib/libc.so.6, ...          its extension modules and the wheels' extensions need
                                (transitive closure, plus libgcc_s for thread unwinding): the
                                host's glibc is never used, so its version does not matter
    lib/python3.11/             the standard library (minus tests, GUI and terminal modules)
    site/                       tenantnet and its dependencies (`pip install --target site`)
    libexec/<command>           one tiny Python entry script per console script
    bin/tenantnet-trampoline    the compiled fast path (trampoline/trampoline.c, static: it
                                uses no library of the host either), when a C compiler and a
                                static libc are there; the installer writes it as `tenantnet`
                                and `tenantnet-ipam`, with the shims as `<name>-shim`
    tenantnet-runtime.json      the manifest: version, content digest, every file's sha256

The shims run `LC_ALL=C lib/ld-linux… --inhibit-cache --library-path lib bin/python3.11
-I -S -B -X utf8 libexec/<command>`: the loader named explicitly (the interpreter's own
PT_INTERP, /lib64/ld-linux…, is never looked up on the host), the host's ld.so.cache
ignored; `-I` so no PYTHON* variable of the caller changes what runs; `-S` because `site`
would only cost start-up time (libexec scripts put `site/` on sys.path themselves); `-B`
so nothing is ever written into the runtime (it is byte-compiled here, and its digest must
hold); `LC_ALL=C` with `-X utf8` so neither glibc nor Python reads the host's locale files
(data of another glibc version). The library path is a loader option, not LD_LIBRARY_PATH,
so the IPAM plugins tenantnet execs (host binaries) never inherit it. A self-check runs
the result that way and fails the build if anything is mapped from outside the runtime.

Run at image build time with the interpreter to bundle (any Debian-style CPython works):

    python3 packaging/build_runtime.py --site /build/site --out /opt/tenantnet/runtime

Standard library only, plus `tenantnet.ops.runtime` from the runtime being built (for the
manifest digest and the launchers, so build and installer share one definition).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

MANIFEST = "tenantnet-runtime.json"
FORMAT = 1

# console script -> "module:function" (pyproject.toml's [project.scripts], plus the installer)
ENTRYPOINTS: dict[str, str] = {
    "tenantnet": "tenantnet.entry.plugin:main",
    "tenantnet-ipam": "tenantnet.entry.ipam:main",
    "tenantnetctl": "tenantnet.ops.ctl:main",
    "tenantnet-install": "tenantnet.ops.install:main",
}

# Parts of the standard library a CNI plugin and its CLI never import; dropping them keeps
# the runtime small and, for the extension modules, keeps their libraries (ncurses,
# readline, Berkeley DB, Tk) out of the library closure.
STDLIB_EXCLUDE_DIRS = {
    "test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "pydoc_data",
    "__phello__", "site-packages", "dist-packages",
}
STDLIB_EXCLUDE_FILE = re.compile(
    r"^(sitecustomize\.py|EXTERNALLY-MANAGED|turtle\.py"
    r"|(_test\w*|_xxtestfuzz|_xxsubinterpreters|xxlimited\w*|_ctypes_test|_curses\w*|_dbm|_gdbm"
    r"|nis|ossaudiodev|readline|_tkinter)\.cpython-[^/]*\.so)$"
)
# Libraries loaded with dlopen(), which ldd cannot see, added by name: glibc loads libgcc_s
# for unwinding on pthread_exit/cancel (Python threads exit that way).
DLOPENED = ("libgcc_s.so.1",)

# Imported by the self-check under the bundled runtime: every shared object they load must
# come from the runtime. Catches a dlopen() nobody listed in DLOPENED before it ships.
SELF_CHECK_IMPORTS = (
    "ssl", "sqlite3", "hashlib", "lzma", "bz2", "zlib", "ctypes", "uuid", "decimal", "json",
    "yaml", "structlog", "pyroute2",
    "cni.skel", "ipam.plugin", "tenantnet.entry.ipam", "tenantnet.entry.plugin", "tenantnet.plugin.core",
    "tenantnet.ops.ctl", "tenantnet.ops.install", "tenantnet.plugin.system.netns",
    "tenantnet.plugin.system.ovsdb",
)
SELF_CHECK = """
import importlib, sys, threading
sys.path.insert(0, sys.prefix + "/site")
for name in sys.argv[1:]:
    importlib.import_module(name)
t = threading.Thread(target=lambda: None); t.start(); t.join()
with open("/proc/self/maps") as fh:
    paths = {line.split()[-1] for line in fh if "/" in line.split()[-1]}
outside = sorted(p for p in paths if not p.startswith(sys.prefix + "/"))
print("\\n".join(outside))
"""

ENTRY_SCRIPT = '''\
# {command}: generated by packaging/build_runtime.py. Run by the shims as
# `python3.11 -I -S {path}`: site/ is put on sys.path here, not by `site`.
import sys

sys.path.insert(0, sys.prefix + "/site")
from {module} import {function}

sys.exit({function}())
'''


# The trampoline: built as the Makefile builds it, and static (the host's glibc is never used).
TRAMPOLINE_SOURCE = Path(__file__).resolve().parent.parent / "trampoline" / "trampoline.c"
TRAMPOLINE = "bin/tenantnet-trampoline"
TRAMPOLINE_CFLAGS = ("-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-D_GNU_SOURCE", "-static")


class BuildError(Exception):
    pass


def build_trampoline(out: Path, source: Path | None, cc: str | None = None) -> str | None:
    """Compile the trampoline into the runtime; its path there, or None when this build
    system cannot (no source, no C compiler, no static C library: the plain shims then)."""
    cc = cc or shutil.which("cc") or shutil.which("gcc")
    if source is None or not source.is_file() or cc is None:
        return None
    libc = subprocess.run([cc, "-print-file-name=libc.a"], capture_output=True, text=True).stdout.strip()
    if not os.path.isabs(libc) or not os.path.isfile(libc):
        print(f"build_runtime: no static C library for {cc} (libc6-dev): no trampoline", file=sys.stderr)
        return None
    target = out / TRAMPOLINE
    target.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([cc, *TRAMPOLINE_CFLAGS, "-o", str(target), str(source)],
                          capture_output=True, text=True)
    if proc.returncode != 0 or proc.stderr.strip():
        raise BuildError(f"the trampoline does not build warning-free:\n{proc.stderr.strip()}")
    if elf_interpreter(target) is not None:
        raise BuildError(f"{target} is not static")
    target.chmod(0o755)
    return TRAMPOLINE


def elf_interpreter(path: Path) -> str | None:
    """PT_INTERP of an ELF file (its dynamic loader), None for static or non-ELF files."""
    with open(path, "rb") as fh:
        ident = fh.read(64)
        if len(ident) < 64 or ident[:4] != b"\x7fELF":
            return None
        is64, little = ident[4] == 2, ident[5] == 1
        end = "<" if little else ">"
        if is64:
            phoff, = struct.unpack(end + "Q", ident[32:40])
            phentsize, phnum = struct.unpack(end + "HH", ident[54:58])
        else:
            phoff, = struct.unpack(end + "I", ident[28:32])
            phentsize, phnum = struct.unpack(end + "HH", ident[42:46])
        for i in range(phnum):
            fh.seek(phoff + i * phentsize)
            ph = fh.read(phentsize)
            p_type, = struct.unpack(end + "I", ph[:4])
            if p_type != 3:  # PT_INTERP
                continue
            if is64:
                offset, = struct.unpack(end + "Q", ph[8:16])
                size, = struct.unpack(end + "Q", ph[32:40])
            else:
                offset, = struct.unpack(end + "I", ph[4:8])
                size, = struct.unpack(end + "I", ph[16:20])
            fh.seek(offset)
            return fh.read(size).rstrip(b"\0").decode()
    return None


def is_elf(path: Path) -> bool:
    with open(path, "rb") as fh:
        return fh.read(4) == b"\x7fELF"


_LDD_LINE = re.compile(r"^\s*(\S+)\s+=>\s+(\S+)\s+\(0x[0-9a-f]+\)$")


def needed_libraries(loader: str, elf: Path) -> dict[str, str]:
    """soname -> resolved path of everything `elf` loads, as the build system's loader sees it."""
    proc = subprocess.run([loader, "--list", str(elf)], capture_output=True, text=True)
    if proc.returncode != 0:
        # a static binary or a file the loader refuses: nothing to bundle for it
        return {}
    found: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        if "not found" in line:
            raise BuildError(f"{elf}: {line.strip()}")
        m = _LDD_LINE.match(line)
        if m:
            found[m.group(1)] = m.group(2)
    return found


def _find_library(loader: str, soname: str) -> str:
    """Resolve a library by soname through the build system's loader cache (for DLOPENED)."""
    out = subprocess.run(["/sbin/ldconfig", "-p"], capture_output=True, text=True).stdout
    machine = {"x86_64": "x86-64", "aarch64": "AArch64"}.get(platform.machine(), "")
    for line in out.splitlines():
        name, _, target = line.strip().partition(" => ")
        if name.split(" ", 1)[0] == soname and machine in name:
            return target
    raise BuildError(f"{soname} not found on the build system (loader {loader})")


def _copy_file(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src, dst, follow_symlinks=True)


def _copy_stdlib(src: Path, dst: Path) -> None:
    for root, dirs, files in os.walk(src):
        rel = Path(root).relative_to(src)
        dirs[:] = sorted(d for d in dirs if d not in STDLIB_EXCLUDE_DIRS and d != "__pycache__"
                         and not d.startswith("config-"))  # libpython.a and Makefile: build-only
        for name in sorted(files):
            path = Path(root, name)
            if STDLIB_EXCLUDE_FILE.match(name) or name.endswith(".pyc") or not path.exists():
                continue  # excluded, or a dangling symlink into the build system's /etc
            _copy_file(path, dst / rel / name)


def self_check(out: Path, loader_name: str, pyver: str,
               imports: tuple[str, ...] = SELF_CHECK_IMPORTS) -> None:
    """Run the built runtime the way a shim does and prove it loads nothing from outside.

    The host's /proc/self/maps cannot lie: any library mapped from outside the runtime
    (a dlopen() the closure missed) would, on a host with another glibc, fail or crash.
    """
    present = tuple(m for m in imports if _importable(out, m))
    proc = subprocess.run(
        [str(out / "lib" / loader_name), "--inhibit-cache", "--library-path", str(out / "lib"),
         str(out / "bin" / pyver), "-I", "-S", "-B", "-X", "utf8", "-c", SELF_CHECK, *present],
        capture_output=True, text=True,
        # as the shims run it (LC_ALL=C), under a caller's locale that would need files
        env={"PATH": "/usr/bin:/bin", "LANG": "en_US.UTF-8", "LC_ALL": "C"})
    if proc.returncode != 0:
        raise BuildError(f"the built runtime fails its self-check:\n{proc.stderr.strip()}")
    outside = [p for p in proc.stdout.split() if p]
    if outside:
        raise BuildError("the built runtime loads files from outside itself (add them to DLOPENED): "
                         + ", ".join(outside))


def _importable(out: Path, module: str) -> bool:
    """Whether `module`'s top-level package is in the runtime (tests build partial ones)."""
    top = module.split(".")[0]
    for base in (out / "site", *(out / "lib").glob("python3.*")):
        if (base / top).is_dir() or (base / f"{top}.py").is_file() or any(base.glob(f"{top}.*.so")):
            return True
    return (top in sys.builtin_module_names or any((out / "lib").glob(f"python3.*/lib-dynload/{top}.*.so")))


def _installer(out: Path) -> Any:
    """tenantnet.ops.runtime from the runtime's site/ (the code that will install this
    runtime), imported as the package module it is (standard library only)."""
    site = (out / "site").resolve()
    if not (site / "tenantnet" / "ops" / "runtime.py").is_file():
        raise BuildError(f"no tenantnet/ops/runtime.py in {site}")
    if str(site) not in sys.path:
        sys.path.insert(0, str(site))
    module = importlib.import_module("tenantnet.ops.runtime")
    loaded = Path(module.__file__ or "").resolve()
    # A caller that imported tenantnet already (the tests) keeps its copy: fine when it is
    # the same code as the runtime's.
    wanted = site / "tenantnet" / "ops" / "runtime.py"
    if not loaded.is_relative_to(site) and loaded.read_bytes() != wanted.read_bytes():
        raise BuildError(f"tenantnet.ops.runtime was imported from {loaded}, which differs from {wanted}")
    return module


def write_launchers(out: Path, launchers: Path) -> list[Path]:
    """Shims for every command in `launchers` (e.g. /usr/local/bin), naming the runtime in place.

    The image runs exactly what the host runs: the same shims (and trampoline), the same runtime.
    """
    install = _installer(out)
    runtime = install.load_runtime(out)
    written = []
    for command in ENTRYPOINTS:
        for name, data in install.plugin_files(runtime, str(out), command):
            path = launchers / name
            install.atomic_write(path, data, install.SHIM_MODE)
            written.append(path)
    return written


def _project_version(site: Path) -> str:
    for info in sorted(site.glob("tenantnet-*.dist-info")):
        for line in (info / "METADATA").read_text().splitlines():
            if line.startswith("Version: "):
                return line.split(": ", 1)[1].strip()
    raise BuildError(f"no tenantnet-*.dist-info in {site}: install tenantnet there first, or pass --version")


def build(out: Path, site: Path, python: Path, busybox: Path, version: str | None = None,
          compile_bytecode: bool = True,
          self_check_imports: tuple[str, ...] = SELF_CHECK_IMPORTS,
          trampoline: Path | None = TRAMPOLINE_SOURCE) -> dict[str, object]:
    """Build the runtime into `out` (which must not exist); return the manifest."""
    if out.exists():
        raise BuildError(f"{out} exists; the runtime is built into a new directory")
    python = python.resolve()
    loader = elf_interpreter(python)
    if not loader:
        raise BuildError(f"{python} is not a dynamically linked ELF interpreter")
    if elf_interpreter(busybox) is not None:
        raise BuildError(f"{busybox} is dynamically linked; the shims need a static busybox (busybox-static)")
    version = version or _project_version(site)
    # Ask the interpreter being bundled, not the one running this script.
    info = json.loads(subprocess.run(
        [str(python), "-I", "-S", "-c",
         "import json, os, platform, sys, sysconfig; print(json.dumps({"
         "'stdlib': sysconfig.get_paths()['stdlib'], 'version': platform.python_version(),"
         "'short': '%d.%d' % sys.version_info[:2], 'machine': platform.machine(),"
         "'glibc': os.confstr('CS_GNU_LIBC_VERSION') or ''}))"],
        capture_output=True, text=True, check=True).stdout)
    pyver = f"python{info['short']}"
    stdlib = Path(info["stdlib"])

    out.mkdir(parents=True)
    _copy_file(python, out / "bin" / pyver)
    _copy_file(busybox, out / "bin" / "busybox")
    os.symlink("busybox", out / "bin" / "sh")
    _copy_stdlib(stdlib, out / "lib" / pyver)
    shutil.copytree(site, out / "site", symlinks=False,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "bin"))
    for command, target in ENTRYPOINTS.items():
        module, function = target.split(":")
        path = out / "libexec" / command
        path.parent.mkdir(exist_ok=True)
        path.write_text(ENTRY_SCRIPT.format(command=command, path=f"libexec/{command}",
                                            module=module, function=function))
    trampoline_path = build_trampoline(out, trampoline)

    # The library closure of every ELF file in the tree, resolved by the build system's
    # loader. Libraries a wheel bundles next to itself ($ORIGIN rpath) are already inside.
    libs: dict[str, str] = {}
    for dirpath, _, files in os.walk(out):
        for name in files:
            path = Path(dirpath, name)
            if path.is_symlink() or not is_elf(path):
                continue
            for soname, resolved in needed_libraries(loader, path).items():
                if not Path(resolved).resolve().is_relative_to(out.resolve()):
                    libs[soname] = resolved
    for soname in DLOPENED:
        libs.setdefault(soname, _find_library(loader, soname))
    for soname, resolved in libs.items():
        _copy_file(Path(resolved), out / "lib" / soname)
    _copy_file(Path(loader), out / "lib" / Path(loader).name)

    if compile_bytecode:
        # unchecked-hash: the .pyc stay valid whatever the copy does to mtimes, and
        # nothing is ever written next to the sources on the host (-I -S, root, /opt).
        subprocess.run([str(python), "-I", "-m", "compileall", "-q", "-j0",
                        "--invalidation-mode", "unchecked-hash",
                        str(out / "lib" / pyver), str(out / "site")], check=True,
                       stdout=subprocess.DEVNULL)

    self_check(out, loader_name=Path(loader).name, pyver=pyver, imports=self_check_imports)
    # The installer's own digest function, from the tenantnet being bundled: the build and
    # the installer cannot disagree on what "this runtime" is.
    install = _installer(out)
    digest, files = install.tree_digest(out)
    glibc = str(info["glibc"])
    manifest: dict[str, object] = {
        "format": FORMAT,
        "name": "tenantnet",
        "version": version,
        "digest": digest,
        "arch": info["machine"],
        "glibc": glibc.split()[-1] if glibc else "",
        "python": f"bin/{pyver}",
        "pythonVersion": info["version"],
        "loader": f"lib/{Path(loader).name}",
        "shell": "bin/sh",
        "entrypoints": {c: f"libexec/{c}" for c in ENTRYPOINTS},
        "files": files,
    }
    if trampoline_path:
        manifest["trampoline"] = trampoline_path
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--site", type=Path, required=True,
                   help="tenantnet and its dependencies, as installed by `pip install --target`")
    p.add_argument("--out", type=Path, required=True, help="the runtime directory to create")
    p.add_argument("--python", type=Path, default=Path(sys.executable),
                   help="the interpreter to bundle (default: this one); its version must match")
    p.add_argument("--busybox", type=Path, default=Path("/bin/busybox"), help="a static busybox")
    p.add_argument("--version", help="tenantnet's version (default: from site/tenantnet-*.dist-info)")
    p.add_argument("--no-compile", action="store_true", help="skip byte-compiling (tests)")
    p.add_argument("--trampoline", type=Path, default=TRAMPOLINE_SOURCE, metavar="SRC",
                   help="the trampoline's C source (default: the repository's); built when a C compiler "
                        "and a static libc are there")
    p.add_argument("--no-trampoline", action="store_true", help="build no trampoline (the plain shims)")
    p.add_argument("--launchers", type=Path, metavar="DIR",
                   help="also write shims for every command into DIR, naming the runtime where it is "
                        "(the image's /usr/local/bin)")
    args = p.parse_args(argv)
    args.out = args.out.absolute()
    try:
        m = build(args.out, args.site, args.python, args.busybox, args.version, not args.no_compile,
                  trampoline=None if args.no_trampoline else args.trampoline)
        if args.launchers:
            write_launchers(args.out, args.launchers)
    except (BuildError, OSError, subprocess.CalledProcessError) as exc:
        print(f"build_runtime: {exc}", file=sys.stderr)
        return 1
    size = sum(f.stat().st_size for f in args.out.rglob("*") if f.is_file() and not f.is_symlink())
    print(f"runtime {m['version']} ({m['arch']}, glibc {m['glibc']}, Python {m['pythonVersion']}) "
          f"in {args.out}: {len(m['files'])} files, {size / 1e6:.0f} MB, digest {str(m['digest'])[:12]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
