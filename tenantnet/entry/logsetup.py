"""Logging for the executables: JSON lines to a file, warnings also to stderr.

The entry layer owns where lines go; the plugin wing only asks for a logger
(`tenantnet.plugin.log.get`). stdout belongs to the CNI result, so nothing here ever
writes to it. Long-lived processes (the agent, tenantnetctl) log through structlog
(`setup`); an exec that runs one call and exits writes the same lines without it
(`setup_one_shot`, tenantnet/entry/oneshotlog.py), because importing structlog would cost
it as much as the call. Either is set up only when something first logs.
"""

from __future__ import annotations

import os
import sys

from tenantnet.plugin import log
from tenantnet.plugin.nodeconfig import DEFAULT_LOG_FILE

TYPE_CHECKING = False  # typing costs milliseconds to import; annotations are strings here
if TYPE_CHECKING:
    import logging
    from typing import Any


def set_default_target(log_file: str, level: str = "info", *, one_shot: bool = False) -> None:
    """Where lines go if nothing called `setup` before something logs: the entry point names
    the node config's log before anything can fail, so that even an early error
    (undecodable stdin) is logged where the admin looks, not in the built-in default path."""
    if one_shot:
        log.configure_on_first_use(lambda: setup_one_shot(log_file, level))
    else:
        log.configure_on_first_use(lambda: setup(log_file, level))


def setup_one_shot(log_file: str = DEFAULT_LOG_FILE, level: str = "info", *, stderr: bool = True) -> None:
    """The log of an exec that handles one call: `setup`'s lines, written without structlog."""
    from tenantnet.entry import oneshotlog

    fd: int | None = None
    try:
        fd = open_log_descriptor(log_file)
    except OSError as exc:
        sys.stderr.write(f"tenantnet: cannot open log file {log_file}: {exc.strerror or exc}\n")
    sink = oneshotlog.Sink(fd, log.level_number(level), stderr)
    log.configured(lambda name: oneshotlog.Logger(name, sink))


def open_log_descriptor(log_file: str) -> int:
    """The log file opened for appending, mode 0640, never through a symlink, never a FIFO or
    a device; its directory is created 0700 if missing."""
    from hostfiles.confined import ensure_private_dir, open_for_append

    ensure_private_dir(os.path.dirname(log_file) or ".")
    return open_for_append(log_file, 0o640)


def open_log_stream(log_file: str) -> Any:
    """`open_log_descriptor` as a text stream."""
    return os.fdopen(open_log_descriptor(log_file), "a", encoding="utf-8")


def setup(log_file: str = DEFAULT_LOG_FILE, level: str = "info", *, stderr: bool = True) -> None:
    """Route structlog and the stdlib `logging` to `log_file` as JSON lines."""
    import logging

    import structlog

    threshold = log.level_number(level)
    handlers: list[logging.Handler] = []
    try:
        handlers.append(logging.StreamHandler(open_log_stream(log_file)))
    except OSError as exc:
        # A read-only /var/log must not break attachments; say it once on stderr.
        sys.stderr.write(f"tenantnet: cannot open log file {log_file}: {exc.strerror or exc}\n")
    if stderr:
        err = logging.StreamHandler(sys.stderr)
        err.setLevel(logging.WARNING)
        err.setFormatter(stderr_formatter())
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
        if h.formatter is None:
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
    log.configured()


def stderr_formatter() -> logging.Formatter:
    """The formatter of stderr lines (also used by the agent for what it relays)."""
    import structlog

    from tenantnet.entry import oneshotlog

    return structlog.stdlib.ProcessorFormatter(
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, oneshotlog.one_line],
        foreign_pre_chain=[structlog.stdlib.add_log_level],
    )


def default_target_from_env(*, one_shot: bool = False) -> None:
    """An executable that has no node config to read (tenantnet-ipam without one) logs to
    $TENANTNET_LOG_FILE, else the built-in default."""
    set_default_target(os.environ.get("TENANTNET_LOG_FILE", DEFAULT_LOG_FILE), one_shot=one_shot)
