"""The renderer's log (tenantnet/ops/rendererctl.py, StderrLog): one whole JSON line per event,
also when several of its threads log at once (what `kubectl logs` and the e2e tier parse)."""

from __future__ import annotations

import io
import json
import sys
import threading
from pathlib import Path

import pytest

from tenantnet.ops.rendererctl import StderrLog


def test_threads_logging_at_once_never_share_a_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # stderr as a pod's log has it with PYTHONUNBUFFERED (or python -u): a file behind a
    # write-through TextIOWrapper, so every write is a syscall during which other threads run.
    out = io.TextIOWrapper(io.FileIO(tmp_path / "renderer.out", "w"), encoding="utf-8", write_through=True)
    monkeypatch.setattr(sys, "stderr", out)
    log = StderrLog()
    # A short switch interval makes the interpreter hand over between a text and its newline
    # as often as it can: print() wrote them apart, and two events met on one line.
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=lambda i=i: [log.info("render.applied", thread=i, n=n, pad="x" * 100)
                                                        for n in range(400)]) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
        out.close()
    lines = (tmp_path / "renderer.out").read_text().splitlines()
    assert len(lines) == 8 * 400
    assert {(e["thread"], e["n"]) for e in map(json.loads, lines)} == {(i, n) for i in range(8) for n in range(400)}
