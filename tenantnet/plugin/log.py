"""The plugin wing's structured logger (structlog, JSON lines in the node's log file).

Where the lines go is decided by the entry layer (`tenantnet/entry/logsetup.py`): before a
call runs it either configures structlog or names what to configure the first time
something logs — so that a call that logs nothing never pays for structlog. Used as a
library with no entry point at all, lines go to stderr, never to stdout (which carries the
CNI result). structlog costs tens of milliseconds to import: only `get` imports it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}

_configured = False
_on_first_use: Callable[[], None] | None = None


def level_number(name: str) -> int:
    """The numeric level of a `logLevel` name; KeyError for a name that is not one."""
    return LEVELS[name.lower()]


def configured() -> None:
    """The entry layer has set structlog up: `get` changes nothing."""
    global _configured, _on_first_use
    _configured, _on_first_use = True, None


def configure_on_first_use(setup: Callable[[], None]) -> None:
    """Run `setup` (it must call `configured`) the first time something logs."""
    global _on_first_use
    if not _configured:
        _on_first_use = setup


def get(name: str = "tenantnet") -> Any:
    import structlog

    if not _configured:
        if _on_first_use is not None:
            _on_first_use()
        if not _configured:
            import sys

            structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
            configured()
    return structlog.get_logger(name)
