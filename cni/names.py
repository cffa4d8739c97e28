"""Validation of caller-supplied names that end up in file paths or kernel objects.

Container ids, interface names and network names become parts of state-file paths and
link names, so they are checked here, once, before anything else sees them: no path
separators, no `..`, no control characters, bounded length.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from cni.errors import CniError, Code

# libcni accepts container ids and network names of this shape; we add a length bound
# so that every derived file name stays well under NAME_MAX (255).
_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")  # used with fullmatch: "$" allows a final "\n"
MAX_ID_LEN = 200
IFNAMSIZ = 15  # the kernel's limit, without the trailing NUL


def _describe(value: str) -> str:
    return repr(value if len(value) <= 80 else value[:77] + "...")


def container_id_problem(value: str) -> str | None:
    if not value:
        return "must not be empty"
    if len(value) > MAX_ID_LEN:
        return f"is {len(value)} characters long; at most {MAX_ID_LEN} allowed"
    if not _ID_RE.fullmatch(value):
        return "may contain only letters, digits, '_', '.', '-' and must start with a letter or digit"
    return None


def network_name_problem(value: str) -> str | None:
    return container_id_problem(value)


def ifname_problem(value: str) -> str | None:
    if not value:
        return "must not be empty"
    size = len(value.encode("utf-8", "surrogateescape"))
    if size > IFNAMSIZ:
        return f"is {size} bytes long; the kernel allows at most {IFNAMSIZ}"
    if value in (".", ".."):
        return "must not be '.' or '..'"
    for ch in value:
        if ch in "/:" or ch.isspace() or not ch.isprintable():
            return f"must not contain {ch!r} (no '/', ':', whitespace or control characters)"
    return None


def check_env_name(var: str, value: str, problem: str | None) -> str:
    if problem:
        raise CniError(Code.INVALID_ENV, f"invalid {var}={_describe(value)}: {problem}")
    return value


def check_config_name(field: str, value: object, problem_of: Callable[[str], str | None]) -> str:
    if not isinstance(value, str):
        raise CniError(
            Code.INVALID_CONFIG, f"invalid network config: {field}={value!r}: must be a string"
        )
    problem = problem_of(value)
    if problem:
        raise CniError(
            Code.INVALID_CONFIG, f"invalid network config: {field}={_describe(value)}: {problem}"
        )
    return value
