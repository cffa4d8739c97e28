"""PCI addresses as the kernel writes them (`0000:3b:00.2`): a string format, no I/O, so the
config decoder (tnconf) and sysfs share one definition without the decoder importing sysfs.
"""

from __future__ import annotations

import re

# Text, not compiled: `re.fullmatch` compiles it the first time a PCI address is read (mode
# sriov), not in every exec that imports the config decoder.
_PCI_ADDRESS = (r"(?:(?P<domain>[0-9a-fA-F]{4}):)?(?P<bus>[0-9a-fA-F]{2}):(?P<device>[0-9a-fA-F]{2})"
                r"\.(?P<function>[0-7])")


def normalise_pci_address(text: str) -> str | None:
    """`0000:3b:00.2` or `3b:00.2` → `0000:3b:00.2` (lowercase); None if malformed.

    Device numbers stop at 0x1f and functions at 7 (a PCI bus has 32 slots of 8 functions),
    so `3b:20.0` or `3b:00.8` are refused here instead of failing later as "not found".
    """
    if not isinstance(text, str):
        return None
    m = re.fullmatch(_PCI_ADDRESS, text)
    if m is None or int(m["device"], 16) > 0x1F:
        return None
    return f"{(m['domain'] or '0000').lower()}:{m['bus'].lower()}:{m['device'].lower()}.{m['function']}"
