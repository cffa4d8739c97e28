"""`in_background` (tenantnet/plugin/drivers/base.py): the helper threads that run a driver's
waiting steps beside the caller, without concurrent.futures."""

from __future__ import annotations

import contextvars
import threading
import time
from collections import Counter

import pytest

from tenantnet.plugin.drivers import base

REQUEST: contextvars.ContextVar[str] = contextvars.ContextVar("request", default="")


def test_results_errors_and_the_callers_context_reach_the_caller() -> None:
    REQUEST.set("add c1/net1")
    ok = base.in_background(lambda a, b: (a + b, REQUEST.get()), 2, 3)
    failed = base.in_background(lambda: {}["missing"])
    assert ok.result() == (5, "add c1/net1") and ok.exception() is None
    failed.wait()
    assert isinstance(failed.exception(), KeyError)
    with pytest.raises(KeyError):
        failed.result()


def test_a_burst_beyond_the_helpers_runs_every_step_once_on_at_most_HELPERS_threads() -> None:
    ran: Counter[int] = Counter()
    threads: set[str] = set()
    lock = threading.Lock()
    running = 0
    most = 0

    def step(i: int) -> int:
        nonlocal running, most
        with lock:
            ran[i] += 1
            threads.add(threading.current_thread().name)
            running += 1
            most = max(most, running)
        time.sleep(0.002 * (i % 4))
        with lock:
            running -= 1
        return i * i

    for _ in range(3):  # later rounds reuse the threads of the first
        steps = [base.in_background(step, i) for i in range(200)]
        assert [s.result() for s in steps] == [i * i for i in range(200)]
    assert set(ran.values()) == {3} and len(ran) == 200
    assert most <= base.HELPERS and len(threads) <= base.HELPERS
    assert all(name.startswith("tenantnet-helper-") for name in threads)


def test_an_idle_helper_takes_the_next_step_at_once() -> None:
    base.in_background(lambda: None).result()
    time.sleep(0.01)  # the helper is back to waiting
    gate = threading.Event()
    first_returned = threading.Event()

    def blocked() -> bool:
        opened = gate.wait(60)  # held until the test opens the gate (60 s: only if it never does)
        first_returned.set()
        return opened

    first = base.in_background(blocked)
    second = base.in_background(lambda: "done")  # must not queue behind the blocked one
    # No clock: the second step was answered while the first was still blocked (queued behind
    # it, it would have been answered only once the first had returned, after 60 s).
    assert second.result() == "done" and not first_returned.is_set()
    gate.set()
    assert first.result() is True
