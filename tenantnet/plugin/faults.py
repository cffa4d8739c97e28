"""Named crash points: every instant a crash can separate two steps of ADD, DEL or GC.

`step("ovs.veth-created")` marks the moment just after that step. In production it costs an
environment lookup. Tests set `TENANTNET_TEST_FAULT=<step>` (or `<step>@<n>`, the n-th time
the step is reached in this process) and the process SIGKILLs itself there — the plugin
exec, or the agent with every request it has in flight. The test suite enumerates the steps
from the calls in the source (tests/integration/test_faults.py), so the list cannot drift
from the code; docs/architecture.md ("Crash safety") says what holds at each.
"""

from __future__ import annotations

import os
import signal
import threading

FAULT_ENV = "TENANTNET_TEST_FAULT"
_seen: dict[str, int] = {}
_lock = threading.Lock()


def step(name: str) -> None:
    """A crash point (see the module docstring); does nothing unless a test asks for it."""
    wanted = os.environ.get(FAULT_ENV)
    if not wanted:
        return
    target, _, nth = wanted.partition("@")
    if target != name:
        return
    with _lock:
        _seen[name] = _seen.get(name, 0) + 1
        count = _seen[name]
    if count >= (int(nth) if nth.isdigit() else 1):
        os.kill(os.getpid(), signal.SIGKILL)
