"""Logging for the executables: JSON lines (structlog) to a file, warnings also to stderr.

stdout belongs to the CNI result, so nothing here ever writes to it. structlog costs tens
of milliseconds to import, so it is imported only when logging is first set up.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

DEFAULT_LOG_FILE = "/var/log/tenantnet/tenantnet.log"
_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}
_configured = False


def level_number(name: str) -> int:
    return _LEVELS[name.lower()]


def setup(log_file: str = DEFAULT_LOG_FILE, level: str = "info", *, stderr: bool = True) -> None:
    """Route structlog and the stdlib `logging` (ovsdbapp's) to `log_file` as JSON lines."""
    global _configured
    import structlog

    threshold = level_number(level)
    handlers: list[logging.Handler] = []
    try:
        os.makedirs(os.path.dirname(log_file) or ".", exist_ok=True)
        handlers.append(logging.FileHandler(log_file))
    except OSError as exc:
        # A read-only /var/log must not break attachments; say it once on stderr.
        sys.stderr.write(f"tenantnet: cannot open log file {log_file}: {exc}\n")
    if stderr:
        err = logging.StreamHandler(sys.stderr)
        err.setLevel(logging.WARNING)
        handlers.append(err)
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    formatter = structlog.stdlib.ProcessorFormatter(
        processor=structlog.processors.JSONRenderer(),
        foreign_pre_chain=[
            structlog.stdlib.add_log_level,
            structlog.stdlib.add_logger_name,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
        ],
    )
    for h in handlers:
        h.setFormatter(formatter)
        root.addHandler(h)
    root.setLevel(threshold)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.stdlib.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.make_filtering_bound_logger(threshold),
        cache_logger_on_first_use=True,
    )
    _configured = True


def get(name: str = "tenantnet") -> Any:
    import structlog

    if not _configured:
        setup(os.environ.get("TENANTNET_LOG_FILE", DEFAULT_LOG_FILE))
    return structlog.get_logger(name)
