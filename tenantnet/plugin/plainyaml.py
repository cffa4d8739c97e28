"""The plain subset of YAML that node configs are written in, read without PyYAML.

PyYAML costs ≈ 20 ms to import, a fifth of an in-process exec. Node configs (the lab's,
the DaemonSet's ConfigMap) are flat: `key: scalar` lines, one-line `[a, b]` lists of paths,
comments. `read` returns what `yaml.safe_load` returns for such a text, and None for
anything else — then the caller asks PyYAML, which also gives the error message for a text
that is not valid YAML. So the node config loader accepts and refuses exactly what it did.

Only what this module can resolve with certainty is read here: a plain scalar is taken as
a string only when it could not be anything else to YAML 1.1's resolvers (no leading digit,
dot, sign or indicator, no bool or null word); decimal integers, simple decimals and the
bool words are resolved as PyYAML resolves them; quoted strings only without escapes;
anything nested, multi-line, tagged, anchored or with a tab falls back to PyYAML.
`tests/unit/test_plainyaml.py` compares both readers on every node config the project
writes and on generated texts.
"""

from __future__ import annotations

import re

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_KEY_LINE = re.compile(r"([A-Za-z][A-Za-z0-9_]*):(?: +(.*?))?[ ]*")
_STRING = re.compile(r"[A-Za-z/_][A-Za-z0-9_./:@+-]*")
_FLOW_ITEM = re.compile(r"[A-Za-z/_][A-Za-z0-9_./@+-]*")  # no ':' inside a flow sequence
_INT = re.compile(r"[-+]?(?:0|[1-9][0-9]*)")
_FLOAT = re.compile(r"[-+]?[0-9]+\.[0-9]+")
_BOOLS = {**dict.fromkeys(("yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON"), True),
          **dict.fromkeys(("no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF"), False)}
_NULLS = ("~", "null", "Null", "NULL")


class _Unsure(Exception):
    """Not in the plain subset: PyYAML decides."""


def read(text: str) -> dict[str, Any] | None:
    """`yaml.safe_load(text)` for a flat node config in the plain subset, else None (and
    None for a text without keys: PyYAML says what that is)."""
    if not text.isascii() or not text.replace("\n", "").isprintable():
        return None  # tabs, CRs, control characters: PyYAML's rules (and errors) apply
    data: dict[str, Any] = {}
    try:
        for line in text.split("\n"):
            stripped = line.strip()
            if not stripped or stripped.startswith("#"):
                continue
            match = _KEY_LINE.fullmatch(line)
            if match is None:
                raise _Unsure
            key, value = match.group(1), match.group(2)
            if key in _BOOLS or key in _NULLS or not value:
                raise _Unsure  # a key YAML resolves, or a block (nested mapping/list) below
            data[key] = _value(_uncomment(value))
    except _Unsure:
        return None
    return data or None


def _uncomment(value: str) -> str:
    """The value without a trailing ` # comment` (a quoted value keeps its `#`s: it then
    no longer parses as quoted, and PyYAML decides)."""
    if value.startswith("#"):
        raise _Unsure  # `key: #...` is an empty value
    head, sep, _ = value.partition(" #")
    return head.rstrip() if sep else value


def _value(value: str) -> Any:
    if value.startswith("[") and value.endswith("]"):
        inner = value[1:-1].strip()
        if not inner:
            return []
        items = [item.strip() for item in inner.split(",")]
        if not all(_FLOW_ITEM.fullmatch(item) and item not in _BOOLS and item not in _NULLS
                   for item in items):
            raise _Unsure
        return items
    return _scalar(value)


def _scalar(value: str) -> Any:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        inner = value[1:-1]
        if any(c in inner for c in "'\"\\") or not inner.isprintable():
            raise _Unsure
        return inner
    if value in _BOOLS:
        return _BOOLS[value]
    if value in _NULLS:
        return None
    if _INT.fullmatch(value):
        return int(value)
    if _FLOAT.fullmatch(value):
        return float(value)
    if _STRING.fullmatch(value) and not value.endswith(":"):
        return value
    raise _Unsure
