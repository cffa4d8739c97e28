"""The two ways into the plugin executables, for tests that must pass through both: the
compiled trampoline (`.venv/bin/tenantnet`, trampoline/trampoline.c) and the Python shim it
falls back to (`.venv/bin/tenantnet-shim`, tenantnet/entry/shim.py). docs/agent.md."""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "trampoline" / "trampoline.c"
WAYS = ("trampoline", "python")


def is_elf(path: Path) -> bool:
    try:
        with open(path, "rb") as fh:
            return fh.read(4) == b"\x7fELF"
    except OSError:
        return False


def compiler() -> str | None:
    return shutil.which("cc") or shutil.which("gcc")


def cflags() -> list[str]:
    """The flags the Makefile builds the trampoline with (one definition, read from there)."""
    m = re.search(r"^TRAMPOLINE_CFLAGS\s*:=\s*(.+)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert m, "Makefile defines no TRAMPOLINE_CFLAGS"
    return m.group(1).split()


def require_trampoline() -> None:
    """Fail (never skip) when the venv's plugins are not the trampoline: CI has a compiler
    (scripts/install-deps.sh installs gcc), so a Python launcher there means the build broke."""
    for command in ("tenantnet", "tenantnet-ipam"):
        if not is_elf(BIN / command):
            pytest.fail(f"{BIN / command} is not the compiled trampoline (C compiler: {compiler()}); "
                        "install gcc and libc6-dev and run `make venv`", pytrace=False)
        if not (BIN / f"{command}-shim").is_file():
            pytest.fail(f"{BIN / command}-shim (the Python fallback) is missing: run `make venv`",
                        pytrace=False)


def executable(way: str, command: str = "tenantnet") -> str:
    """The path to exec for `command` the `way` way."""
    if way == "trampoline":
        require_trampoline()
        return str(BIN / command)
    assert way == "python", way
    return str(BIN / f"{command}-shim")
