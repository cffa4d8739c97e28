"""Polling for a condition instead of sleeping a fixed time (shared by every test tier)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def poll(predicate: Callable[[], Any], timeout: float, interval: float = 0.02) -> bool:
    """True as soon as `predicate()` is true; False once `timeout` seconds have passed."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)
