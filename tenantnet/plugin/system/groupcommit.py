"""Group commit: the requests of concurrent callers for one slow step, done as one batch.

Why: some steps cost about as much for many requests as for one. Deleting veths waits for
RCU grace periods once per unregistration, however many links it holds (`netlink._Reaper`);
ovs-vswitchd reconfigures once per OVSDB transaction, however many ports it changes
(`ovsdb.Ovsdb._rpc_commit`). Done one by one, N concurrent requests pay that cost N times in
a row; batched, about twice.

How: the first caller to arrive becomes the leader and runs its request at once, as a batch
of one. Callers arriving while a batch is in flight queue; when it ends, one of them becomes
the next leader, takes every request queued meanwhile (up to `max_batch`, oldest first) and
runs them as one batch through the owner's `run`. Each caller waits for its own request's
outcome only, whichever caller led the batch that held it.

`run` settles each request of its batch: `succeed` or `fail`, so that one refused request
fails only its own caller, or a failure of the whole batch reaches all of them — the owner
decides. Should `run` raise instead, the leader's caller gets that exception; every request
`run` left unsettled gets the owner's `interrupted` error: no caller is left waiting, none is
told that a request which may not have run succeeded, and no request runs twice.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

Request = TypeVar("Request")
Outcome = TypeVar("Outcome")

# Plain classes with __slots__, not dataclasses: every in-process CNI call imports this module
# (through ovsdb and netlink), and decorating them as dataclasses costs ≈ 0.7 ms there.


class Gathering:
    """A leader whose own request came within `burst_gap` s of the one before it (a burst)
    waits for company before taking its batch: up to `wait` s, or until `enough` requests are
    queued. Outside a burst, a request never waits for others."""

    __slots__ = ("burst_gap", "wait", "enough")

    def __init__(self, burst_gap: float, wait: float, enough: int) -> None:
        self.burst_gap, self.wait, self.enough = burst_gap, wait, enough


class Pending(Generic[Request, Outcome]):
    """One caller's request, queued or in a batch; the owner's `run` settles it, once."""

    __slots__ = ("request", "settled", "error", "result")
    result: Outcome  # set by `succeed`

    def __init__(self, request: Request) -> None:
        self.request = request
        self.settled = False
        self.error: Exception | None = None

    def succeed(self, result: Outcome) -> None:
        self.result = result
        self.settled = True  # after the result: a caller may look the moment this is True

    def fail(self, error: Exception) -> None:
        self.error = error
        self.settled = True


class GroupCommit(Generic[Request, Outcome]):
    """Concurrent requests run in batches by whichever caller leads (see the module)."""

    def __init__(self, run: Callable[[list[Pending[Request, Outcome]]], None], *,
                 interrupted: Callable[[Request], Exception], max_batch: int | None = None,
                 gathering: Gathering | None = None) -> None:
        self._run = run
        self._interrupted = interrupted
        self._max_batch = max_batch
        self._gathering = gathering
        self._cond = threading.Condition(threading.Lock())
        self._queued: list[Pending[Request, Outcome]] = []
        self._running = False  # a leader is gathering or running a batch
        self._leader_gathers = False  # only then are arrivals announced
        self._last_arrival = float("-inf")  # time.monotonic() of the latest request

    @property
    def idle(self) -> bool:
        """Nothing queued or in flight: a request now would run at once. A hint only — it may
        have changed by the time the caller acts on it."""
        return not self._running and not self._queued

    def submit(self, request: Request) -> Outcome:
        """`request`'s outcome once the batch that held it has run (this caller's or another's):
        its result, or its error raised."""
        mine: Pending[Request, Outcome] = Pending(request)
        with self._cond:
            now = time.monotonic()
            gathering = self._gathering
            if gathering is not None and now - self._last_arrival >= gathering.burst_gap:
                gathering = None  # not in a burst
            self._last_arrival = now
            self._queued.append(mine)
            if self._leader_gathers:
                self._cond.notify_all()  # the leader counts arrivals
        while not mine.settled:
            with self._cond:
                while not mine.settled and self._running:
                    self._cond.wait()
                if mine.settled:
                    break
                self._running = True
                if gathering is not None:
                    self._gather(gathering)
                cut = len(self._queued) if self._max_batch is None else self._max_batch
                batch, self._queued = self._queued[:cut], self._queued[cut:]
            ran = False
            try:
                self._run(batch)
                ran = True
            finally:
                with self._cond:
                    for pending in batch:
                        if not pending.settled:
                            pending.fail(self._interrupted(pending.request))
                    if not ran and not mine.settled:
                        # Not in this batch, and its caller gets `run`'s exception: it must not
                        # run later, in someone else's batch.
                        self._queued.remove(mine)
                    self._running = False
                    self._cond.notify_all()
        if mine.error is not None:
            raise mine.error
        return mine.result

    def _gather(self, gathering: Gathering) -> None:
        """Wait for company, holding the condition (see Gathering)."""
        until = time.monotonic() + gathering.wait
        self._leader_gathers = True
        while len(self._queued) < gathering.enough and (left := until - time.monotonic()) > 0:
            self._cond.wait(left)
        self._leader_gathers = False
