"""The frame every tenantnet CNI executable runs in: env + stdin in, one JSON document out.

Whatever happens inside a handler, the caller gets either the result or a CNI error
JSON on stdout and an exit code; a bug becomes code 100 with its cause in the log, never
a traceback on stdout.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping
from typing import Any, TextIO

from cni import version as cniversion
from cni.env import CniEnv, parse_env
from cni.errors import CniError, Code
from cni.netconf import config_version, decode_json

# A handler gets the parsed env and the decoded stdin; it returns the JSON document to
# print (a dict) or None (DEL, GC: nothing to print).
Handler = Callable[[CniEnv, dict[str, Any]], dict[str, Any] | None]


def run(
    handler: Handler,
    environ: Mapping[str, str],
    stdin: bytes,
    on_unexpected: Callable[[BaseException], None] | None = None,
) -> tuple[int, str]:
    """Run one CNI invocation; returns (exit code, stdout text)."""
    raw: dict[str, Any] = {}
    try:
        env = parse_env(environ)
        if env.command == "VERSION":
            return 0, json.dumps(cniversion.version_info())
        raw = decode_json(stdin)
        out = handler(env, raw)
        return 0, json.dumps(out) if out is not None else ""
    except CniError as err:
        if not raw:
            raw = _peek(stdin)  # env errors come before stdin is read: answer in its version
        return 1, json.dumps(err.to_dict(config_version(raw)))
    except Exception as exc:  # noqa: BLE001 - the one place a bug is turned into code 100
        if on_unexpected is not None:
            on_unexpected(exc)
        # Not `err`: that name is the CniError handler's, unbound again when its block ends.
        internal = CniError(Code.INTERNAL, f"internal error: {type(exc).__name__}: {exc}",
                            "see the tenantnet log file for the traceback")
        return 1, json.dumps(internal.to_dict(config_version(raw)))


def _peek(stdin: bytes) -> dict[str, Any]:
    try:
        return decode_json(stdin)
    except CniError:
        return {}


def main(handler: Handler, on_unexpected: Callable[[BaseException], None] | None = None,
         stdout: TextIO | None = None) -> int:
    import os

    stdin = b"" if sys.stdin is None or sys.stdin.closed else sys.stdin.buffer.read()
    code, text = run(handler, os.environ, stdin, on_unexpected)
    out = stdout or sys.stdout
    if text:
        out.write(text + "\n")
    out.flush()
    return code
