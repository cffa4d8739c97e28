"""The one-shot exec's log writer (tenantnet/entry/oneshotlog.py) writes the lines the
agent's structlog set-up writes: same fields in the same order, same threshold, same
exception text, same one line on stderr. Each writer runs in a fresh interpreter, as each
executable does (the logger is process-wide state)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# The same calls for both writers; `SETUP` is replaced by the set-up under test.
SCRIPT = textwrap.dedent("""
    import pathlib, sys
    sys.path.insert(0, {root!r})
    from tenantnet.entry import logsetup
    from tenantnet.plugin import log
    SETUP({log_file!r}, {level!r})
    core = log.get("tenantnet.plugin.core")
    core.debug("add.debug", detail="only at debug")
    core.info("add.done", network="n1", container_id="c" * 64, ifname="net1", rules=3,
              warm=True, gone=None, ratio=1.5, vlans=(1, 2), path=pathlib.Path("/a"),
              text="ünïcode \\u2028 \\"quoted\\"")
    core.warning("add.failed", network="n1", code=11, error="OVSDB did not answer")
    log.get("tenantnet.prewarm").error("prewarm.failed", reason="no OpenFlow number")
    try:
        {{}}["missing"]
    except KeyError as exc:
        core.error("internal_error", error="KeyError: 'missing'", exc_info=exc)
    try:
        1 / 0
    except ZeroDivisionError:
        core.warning("add.failed.traceback", exc_info=True)
    core.info("no_exception", exc_info=None)
    # Nothing of structlog is imported by the one-shot writer.
    print("structlog" in sys.modules, file=sys.stderr)
""")

SETUPS = {"structlog": "logsetup.setup", "one-shot": "logsetup.setup_one_shot"}
TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{6})?Z")


def run_writer(which: str, tmp_path: Path, level: str) -> tuple[list[dict[str, object]], list[str], bool]:
    log_file = tmp_path / which / "tenantnet.log"
    script = SCRIPT.format(root=str(ROOT), log_file=str(log_file), level=level)
    script = script.replace("SETUP(", SETUPS[which] + "(")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    *stderr, imported = proc.stderr.splitlines()
    lines = [json.loads(line) for line in log_file.read_text(encoding="utf-8").splitlines()]
    return lines, stderr, imported == "True"


def normalised(lines: list[dict[str, object]]) -> list[list[tuple[str, object]]]:
    """The lines with the timestamps checked and taken out; key order kept."""
    out = []
    for line in lines:
        assert TIMESTAMP.fullmatch(str(line["timestamp"])), line["timestamp"]
        out.append([(k, "<ts>" if k == "timestamp" else v) for k, v in line.items()])
    return out


@pytest.mark.parametrize("level", ["debug", "info", "warning"])
def test_one_shot_lines_are_structlogs_lines(tmp_path: Path, level: str) -> None:
    ours, our_stderr, ours_imported = run_writer("one-shot", tmp_path, level)
    theirs, their_stderr, theirs_imported = run_writer("structlog", tmp_path, level)
    assert theirs_imported and not ours_imported
    assert normalised(ours) == normalised(theirs)
    assert our_stderr == their_stderr
    events = [line["event"] for line in ours]
    expected = {"debug": 7, "info": 6, "warning": 4}[level]
    assert len(events) == expected and ("add.debug" in events) == (level == "debug")
    failed = next(line for line in ours if line["event"] == "internal_error")
    assert str(failed["exception"]).startswith("Traceback (most recent call last):")
    assert str(failed["exception"]).endswith("KeyError: 'missing'")
    assert "tenantnet: warning: add.failed: OVSDB did not answer" in our_stderr


def test_an_unwritable_log_file_says_so_once_and_the_call_goes_on(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        from tenantnet.entry import logsetup
        from tenantnet.plugin import log
        logsetup.setup_one_shot({str(blocker / "sub" / "t.log")!r}, "info")
        log.get().info("add.done")
        log.get().warning("add.failed", error="boom")
        print("done")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert proc.stdout == "done\n"
    first, second = proc.stderr.splitlines()
    assert first.startswith(f"tenantnet: cannot open log file {blocker}/sub/t.log: ")
    assert second == "tenantnet: warning: add.failed: boom"


def test_timestamps_are_structlogs() -> None:
    import datetime

    from tenantnet.entry.oneshotlog import timestamp

    for now in (0.0, 1764689000.5, 1764689000.000001, 1764689000.999999, 1764689001.0):
        expected = datetime.datetime.fromtimestamp(now, datetime.UTC).isoformat().replace("+00:00", "Z")
        assert timestamp(now) == expected, now


def test_setting_the_log_up_again_and_again_keeps_no_descriptor_per_call(tmp_path: Path) -> None:
    """What a test suite (or any process running calls in-process one after another) does;
    a logger still held writes to its own file, never through a reused descriptor."""
    script = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(ROOT)!r})
        from tenantnet.entry import logsetup
        from tenantnet.plugin import log
        first = None
        before = len(os.listdir("/proc/self/fd"))
        for i in range(300):
            logsetup.setup_one_shot({str(tmp_path / "t.log")!r}, "info")
            log.get().info("call", i=i)
            first = first or log.get()
        print(len(os.listdir("/proc/self/fd")) - before)
        other = open({str(tmp_path / "other")!r}, "w")  # may get a freed descriptor number
        first.info("held.logger")
        other.close()
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert int(proc.stdout) <= 2  # the last sink's file (and the first, still held)
    lines = [json.loads(line) for line in (tmp_path / "t.log").read_text().splitlines()]
    assert [line.get("i") for line in lines[:300]] == list(range(300))
    assert lines[-1]["event"] == "held.logger"
    assert (tmp_path / "other").read_text() == ""
