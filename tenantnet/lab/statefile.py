"""A lab simulation's state: one JSON file, changed under a file lock by every process that
simulates the device (the plugin, the agent, tests), replaced by rename so a reader never
sees half of it. Used by the simulated NIC (`nic.py`) and RDMA subsystem (`rdma.py`)."""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def locked(path: Path, initial: Callable[[], dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """The state at `path` (`initial()` when there is none yet), held under `<path>.lock`;
    what the caller changed in it is written back when the block ends."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            before = path.read_text()
            state = json.loads(before)
        except FileNotFoundError:
            before, state = "", initial()
        yield state
        # Compact: `indent` would switch json to its pure-Python encoder, and the NIC's state is
        # rewritten once per VF attribute (`tenantnetctl lab status` shows it readably).
        after = json.dumps(state, sort_keys=True)
        if after != before:  # reads are most calls: no rename (≈ 1 ms on ext4) for them
            tmp = path.with_suffix(".tmp")
            tmp.write_text(after)
            os.replace(tmp, path)
    finally:
        os.close(fd)


def read(path: Path, initial: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """The state at `path` without the lock (a snapshot), `initial()` when there is none."""
    try:
        return json.loads(path.read_text())  # type: ignore[no-any-return]
    except FileNotFoundError:
        return initial()
