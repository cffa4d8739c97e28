"""The log of a one-shot exec: the JSON lines the agent's structlog writes, without structlog.

An exec that runs one CNI call in its own process (the in-process fallback of `tenantnet`
and `tenantnet-ipam`, when no agent answers) pays every import on every call. structlog
costs 25–45 ms to import here (its package imports asyncio, and `logging` with it) — as
much as the whole rest of the call — so such an exec writes its lines with this small
writer instead: the same JSON object per line as `logsetup.setup` configures structlog to
write (the call's fields, then `event`, `level`, `timestamp` in UTC ISO 8601, `exception`
when there is one; a value JSON cannot hold is written as its repr), the same threshold,
and the same one line on stderr for a warning or an error. `tests/unit/test_oneshotlog.py`
holds both writers to the same lines. The agent, which lives for days, logs with structlog.

Each line is one `write` on an O_APPEND descriptor, so lines of the call's helper threads
(and of concurrent execs) never interleave within a line.
"""

from __future__ import annotations

import sys
import time

from tenantnet.plugin import log

TYPE_CHECKING = False  # typing costs milliseconds to import; annotations are strings here
if TYPE_CHECKING:
    from typing import Any


def timestamp(now: float) -> str:
    """`now` as structlog's TimeStamper(fmt="iso", utc=True) writes it."""
    seconds = int(now)
    micros = round((now - seconds) * 1_000_000)  # rounded as datetime rounds it
    if micros == 1_000_000:
        seconds, micros = seconds + 1, 0
    text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
    return f"{text}.{micros:06d}Z" if micros else f"{text}Z"


def exception_text(exc_info: Any) -> str:
    """What structlog's format_exc_info writes for `exc_info` (True, an exception, a tuple)."""
    import traceback

    if exc_info is True:
        exc_info = sys.exc_info()
    if isinstance(exc_info, BaseException):
        exc_info = (type(exc_info), exc_info, exc_info.__traceback__)
    if not isinstance(exc_info, tuple) or exc_info[0] is None:
        return ""
    return "".join(traceback.format_exception(*exc_info)).rstrip("\n")


def one_line(_logger: Any, _name: str, event: dict[str, Any]) -> str:
    """stderr gets one readable line per warning or error; tracebacks stay in the log file
    (a structlog processor too: logsetup's stderr formatter ends with it)."""
    detail = next((str(event[k]) for k in ("error", "reason", "problem", "msg") if event.get(k)), "")
    text = str(event.get("event", ""))
    return f"tenantnet: {event.get('level', 'warning')}: {text}" + (f": {detail}" if detail else "")


class Sink:
    """Where one exec's lines go: the log file (from its descriptor; None when it cannot be
    opened), the threshold, and whether warnings and errors also get their line on stderr.

    The file is an unbuffered binary file object, so each line is still one write, and the
    descriptor is closed when the last logger of this sink is gone — not before: a process
    that sets its log up again (a test running calls in-process one after another) neither
    keeps a descriptor per call nor writes through a number the kernel may have reused."""

    def __init__(self, fd: int | None, threshold: int, stderr: bool) -> None:
        self.file = open(fd, "ab", buffering=0, closefd=True) if fd is not None else None  # noqa: SIM115
        self.threshold = threshold
        self.stderr = stderr

    def emit(self, name: str, level: str, event: str, fields: dict[str, Any]) -> None:
        import json

        exc_info = fields.pop("exc_info", None)
        entry = {**fields, "event": event, "level": level, "timestamp": timestamp(time.time())}
        if exc_info:
            text = exception_text(exc_info)
            if text:
                entry["exception"] = text
        if self.file is not None:
            line = json.dumps(entry, default=repr) + "\n"
            try:
                self.file.write(line.encode("utf-8", "backslashreplace"))
            except OSError:
                pass  # a full or broken log disk must not fail the attachment
        if self.stderr and log.LEVELS[level] >= log.LEVELS["warning"]:
            sys.stderr.write(one_line(None, name, entry) + "\n")


class Logger:
    """What `tenantnet.plugin.log.get(name)` returns in a one-shot exec: the structlog
    methods the code calls (`debug`, `info`, `warning`, `error` with keyword fields)."""

    def __init__(self, name: str, sink: Sink) -> None:
        self.name = name
        self.sink = sink

    def _log(self, level: str, event: str, fields: dict[str, Any]) -> None:
        if log.LEVELS[level] >= self.sink.threshold:
            self.sink.emit(self.name, level, event, fields)

    def debug(self, event: str, **fields: Any) -> None:
        self._log("debug", event, fields)

    def info(self, event: str, **fields: Any) -> None:
        self._log("info", event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._log("warning", event, fields)

    def error(self, event: str, **fields: Any) -> None:
        self._log("error", event, fields)
