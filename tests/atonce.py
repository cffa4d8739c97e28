"""Independent probes of one test (pings between its pods) run at once, not one after another.

A ping that must fail waits out its whole deadline (seconds), and one that must succeed still
waits for its probes' interval; several such checks in a row add up. `at_once` runs each call
in its own thread and gives the results back in the order of the calls, so a test keeps its
assertions exactly as they were and only the waiting overlaps. Only for calls that do not
depend on one another (probes from or to different pods, or reading the same state).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


def at_once(*calls: Callable[[], T]) -> list[T]:
    """Run every call at the same time; their results (or the first exception) in order."""
    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        futures = [pool.submit(call) for call in calls]
        return [f.result() for f in futures]
