"""CNI error codes and the one exception type every layer raises to the caller.

The codes below 100 are the CNI specification's; the ones from 100 up are tenantnet's
own and are documented in docs/errors.md. An error reaches the runtime as JSON on
stdout (see `CniError.to_dict`), never as a traceback.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any


class Code(IntEnum):
    INCOMPATIBLE_VERSION = 1
    UNSUPPORTED_FIELD = 2
    UNKNOWN_CONTAINER = 3
    INVALID_ENV = 4
    IO_FAILURE = 5
    DECODE_FAILURE = 6
    INVALID_CONFIG = 7
    TRY_AGAIN_LATER = 11
    NOT_AVAILABLE = 50
    NOT_AVAILABLE_DEGRADED = 51
    # tenantnet's own codes (>= 100); keep docs/errors.md in step.
    INTERNAL = 100
    NETLINK_FAILURE = 101
    OVSDB_FAILURE = 102
    CHECK_FAILED = 103
    IPAM_PLUGIN_FAILED = 104
    OFFLOAD_PRECONDITION = 105
    RDMA_NOT_ISOLATED = 106
    RAIL_MISALIGNED = 107
    POOL_EXHAUSTED = 110
    ADDRESS_UNAVAILABLE = 111
    TENANT_DENIED = 120


class CniError(Exception):
    """An error reported to the CNI caller: spec code, one-line message, details."""

    def __init__(self, code: int, msg: str, details: str = "") -> None:
        super().__init__(msg)
        self.code = int(code)
        self.msg = msg
        self.details = details

    def to_dict(self, cni_version: str) -> dict[str, Any]:
        out: dict[str, Any] = {"cniVersion": cni_version, "code": self.code, "msg": self.msg}
        if self.details:
            out["details"] = self.details
        return out

    def __repr__(self) -> str:
        return f"CniError({self.code}, {self.msg!r}, {self.details!r})"


def invalid_config(field: str, value: Any, allowed: str) -> CniError:
    """Code 7 naming the field, the value given and what would have been accepted."""
    return CniError(
        Code.INVALID_CONFIG,
        f"invalid network config: {field}={value!r}: {allowed}",
    )
