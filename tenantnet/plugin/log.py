"""The plugin wing's structured logger (JSON lines in the node's log file).

Where the lines go is decided by the entry layer (`tenantnet/entry/logsetup.py`): before a
call runs it either configures the logger or names what to configure the first time
something logs — so that a call that logs nothing never pays for it. The logger is
structlog's, or, in an exec that handles one call, one that writes the same lines without
importing structlog (the entry layer hands its factory to `configured`). Used as a library
with no entry point at all, lines go to stderr, never to stdout (which carries the CNI
result). structlog costs tens of milliseconds to import: only `get` imports it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}

_configured = False
_on_first_use: Callable[[], None] | None = None
_factory: Callable[[str], Any] | None = None  # None: structlog's get_logger


def level_number(name: str) -> int:
    """The numeric level of a `logLevel` name; KeyError for a name that is not one."""
    return LEVELS[name.lower()]


def configured(factory: Callable[[str], Any] | None = None) -> None:
    """The entry layer has set the logger up: `get` changes nothing and returns
    `factory(name)`, or structlog's logger when there is no factory."""
    global _configured, _on_first_use, _factory
    _configured, _on_first_use, _factory = True, None, factory


def configure_on_first_use(setup: Callable[[], None]) -> None:
    """Run `setup` (it must call `configured`) the first time something logs."""
    global _on_first_use
    if not _configured:
        _on_first_use = setup


def get(name: str = "tenantnet") -> Any:
    if not _configured and _on_first_use is not None:
        _on_first_use()
    if _factory is not None:
        return _factory(name)
    import structlog

    if not _configured:
        import sys

        structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
        configured()
    return structlog.get_logger(name)
