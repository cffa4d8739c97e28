"""CNI specification versions this plugin implements, and comparisons between them."""

from __future__ import annotations

from cni.errors import CniError, Code

CURRENT = "1.1.0"
SUPPORTED: tuple[str, ...] = ("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")


def parse(version: str) -> tuple[int, int, int]:
    parts = version.split(".")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise ValueError(version)
    return int(parts[0]), int(parts[1]), int(parts[2])


def require_supported(version: object) -> str:
    """Return the version if implemented, else raise code 1 listing what is."""
    if not isinstance(version, str) or version not in SUPPORTED:
        raise CniError(
            Code.INCOMPATIBLE_VERSION,
            f"incompatible CNI version: cniVersion={version!r}; "
            f"supported: {', '.join(SUPPORTED)}",
        )
    return version


def at_least(version: str, minimum: str) -> bool:
    return parse(version) >= parse(minimum)


def version_info() -> dict[str, object]:
    return {"cniVersion": CURRENT, "supportedVersions": list(SUPPORTED)}
