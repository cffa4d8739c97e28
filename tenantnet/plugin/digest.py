"""SHA-256 of names (interface names, record file names, ownership marks).

hashlib loads OpenSSL when it is imported — ≈ 2–3 ms of every one-shot exec of the plugin,
for a few dozen bytes hashed per call. CPython's own SHA-256 module is built into the
interpreter (`_sha256`, `_sha2` from 3.12 on) and gives the same digests; hashlib's is the
fallback where it is not built in.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # typing costs milliseconds to import; annotations are strings here
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any


def _sha256() -> Callable[[bytes], Any]:
    for name in ("_sha2", "_sha256"):
        if name in sys.builtin_module_names:
            return __import__(name).sha256  # type: ignore[no-any-return]
    from hashlib import sha256

    return sha256


_new = _sha256()


def sha256_hex(data: bytes) -> str:
    return str(_new(data).hexdigest())


def sha256_bytes(data: bytes) -> bytes:
    return bytes(_new(data).digest())
