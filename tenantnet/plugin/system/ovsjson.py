"""A JSON parser for the `ovs` library's JSON-RPC stream, on the standard library's C decoder.

The `ovs` package from PyPI ships without its C accelerator (`ovs._json`, built only
against libopenvswitch), so every OVSDB message is parsed one character at a time in
Python: ≈ 7 µs per character here, ≈ 5 ms of CPU per port transaction and seconds for
the initial sync of a node with a thousand ports. `ovs.json` has a slot for the
accelerator; `install()` fills it with this parser when the real one is absent.

Interface (what `ovs.jsonrpc` and `ovs.json.from_string` use): `feed(text)` takes the
unconsumed input and returns how many UTF-8 bytes of it belong to the current value
(everything, until the value is complete); `is_done()`; `finish()` returns the value, or
an error message string. A small scanner tracks strings and nesting over the few
structural characters only (found by a regular expression at C speed) to find where
the top-level value ends; `json.loads` then decodes it in one go.
"""

from __future__ import annotations

import json
import re
from typing import Any

_STRUCTURE = re.compile(r'["\\{}\[\]]')
_OPEN = "{["
MAX_VALUE = 256 << 20  # characters; a corrupt stream must not grow without bound


class Parser:
    def __init__(self, check_trailer: bool = False) -> None:
        self.check_trailer = check_trailer
        self._parts: list[str] = []
        self._size = 0
        self._depth = 0
        self._started = False
        self._in_string = False
        self._skip = 0  # an escape at the very end of the previous chunk hides this many chars
        self._value: Any = None
        self._error: str | None = None
        self._done = False

    def feed(self, text: str) -> int:
        if self._done:
            return 0
        start = 0
        if not self._started:
            stripped = text.lstrip(" \t\r\n")
            if not stripped:
                return len(text.encode())
            if stripped[0] not in _OPEN:
                return self._fail(text, "a JSON-RPC message must be an object or an array")
            start = len(text) - len(stripped)
            self._started = True
        end = self._scan(text, start)
        if end is None:
            self._parts.append(text)
            self._size += len(text)
            if self._size > MAX_VALUE:
                return self._fail(text, f"a JSON value longer than {MAX_VALUE} characters")
            return len(text.encode())
        self._parts.append(text[:end])
        self._done = True
        try:
            self._value = json.loads("".join(self._parts))
        except ValueError as exc:
            self._error = f"invalid JSON: {exc}"
        self._parts = []
        if self.check_trailer and text[end:].strip(" \t\r\n"):
            self._error = "trailing garbage at end of input"
            return len(text.encode())
        return len(text[:end].encode())

    def _scan(self, text: str, start: int) -> int | None:
        """The index just past the top-level value's end in `text`, or None if not there."""
        skip_until = start + self._skip
        self._skip = 0
        for match in _STRUCTURE.finditer(text, start):
            i = match.start()
            if i < skip_until:
                continue
            char = match.group()
            if self._in_string:
                if char == "\\":
                    skip_until = i + 2
                    if skip_until > len(text):
                        self._skip = skip_until - len(text)
                elif char == '"':
                    self._in_string = False
            elif char == '"':
                self._in_string = True
            elif char in _OPEN:
                self._depth += 1
            else:
                self._depth -= 1
                if self._depth == 0:
                    return i + 1
        return None

    def _fail(self, text: str, message: str) -> int:
        self._error = message
        self._done = True
        return len(text.encode())

    def is_done(self) -> bool:
        return self._done

    def finish(self) -> Any:
        if not self._done:
            return "unexpected end of input" if self._started else "empty input stream"
        return self._error if self._error is not None else self._value


def install() -> bool:
    """Put this parser in `ovs.json`'s accelerator slot unless the C one is there.
    Returns True if it was installed (now or earlier)."""
    import ovs
    import ovs.json

    if ovs.json.PARSER == ovs.json.PARSER_C:
        return getattr(ovs, "_json", None) is _SLOT
    ovs._json = _SLOT
    # ovs.json names the package only through its failed `import ovs._json`.
    ovs.json.ovs = ovs
    ovs.json.PARSER = ovs.json.PARSER_C
    return True


class _Slot:
    """Stands for the `ovs._json` extension module: only `Parser` is looked up on it."""

    Parser = Parser


_SLOT = _Slot()
