"""Running netlink work inside a pod's network namespace, cheaply.

`IPRoute(netns=path)` forks a helper per call (8–25 ms here). Instead a short-lived
thread enters the namespace with setns(2) and opens a plain netlink socket there
(≈ 1 ms): a socket belongs to the namespace it was created in, and setns only moves the
calling thread, so the rest of the process stays in the host namespace.
"""

from __future__ import annotations

import ctypes
import errno
import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")
CLONE_NEWNET = 0x40000000
NETNS_THREAD = "tenantnet-netns"  # the name of threads that have entered a pod namespace
_libc = ctypes.CDLL(None, use_errno=True)


class NamespaceNotFound(Exception):
    """The netns path does not exist or is not a network namespace."""


def netns_exists(path: str) -> bool:
    if not path:
        return False
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    os.close(fd)
    return True


def run_in_netns(path: str, work: Callable[[Any], T]) -> T:
    """Call `work(ipr)` with an IPRoute socket opened inside the namespace at `path`."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise NamespaceNotFound(f"network namespace {path} does not exist") from None
    except OSError as exc:
        raise NamespaceNotFound(f"cannot open network namespace {path}: {exc.strerror}") from None
    outcome: dict[str, Any] = {}

    def body() -> None:
        try:
            if _libc.setns(fd, CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                if err == errno.EINVAL:
                    raise NamespaceNotFound(f"{path} is not a network namespace")
                raise OSError(err, os.strerror(err), path)
            from pyroute2 import IPRoute

            ipr = IPRoute()
            try:
                outcome["value"] = work(ipr)
            finally:
                ipr.close()
        except BaseException as exc:  # handed to the caller's thread below
            outcome["error"] = exc

    try:
        worker = threading.Thread(target=body, name=NETNS_THREAD)
        worker.start()
        worker.join()
    finally:
        os.close(fd)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]  # type: ignore[no-any-return]
