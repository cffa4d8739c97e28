"""D6: `tenantnetctl … | head -1` ends quietly. Every subcommand goes through one place
(tenantnet/ops/ctl.py main → agentctl.exit_status_of): stdout whose reader has gone is exit
141 (as a process killed by SIGPIPE), with no BrokenPipeError traceback on stderr.

The reader is made to be gone before the command writes (the read end of its stdout pipe is
closed before it starts), so the broken pipe happens every time, not only when `head` wins
a race."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tenantnet.entry import agentctl

CTL = str(Path(sys.executable).parent / "tenantnetctl")


def run_with_reader_gone(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(args, stdout=write_end, stderr=subprocess.PIPE, timeout=120, check=False,
                              env={**os.environ, **(env or {})})
    finally:
        os.close(write_end)


@pytest.fixture
def node_config(tmp_path: Path) -> Path:
    path = tmp_path / "node.yaml"
    path.write_text(f"stateDir: {tmp_path}/state\nagentSocket: {tmp_path}/sock/agent.sock\n"
                    f"ipamDataDirs: [{tmp_path}/ipam]\nipamDataDir: {tmp_path}/ipam/default\n")
    return path


@pytest.mark.parametrize("args", [
    ["agent", "status", "--json"],       # not running: the JSON answer on stdout, exit 3 otherwise
    ["ls"],
    ["ls", "--json"],
    ["policy", "show"],
    ["--help"],                          # argparse's own output goes through the same place
    ["agent", "--help"],
])
def test_tenantnetctl_with_its_reader_gone_exits_141_without_a_traceback(node_config, args):
    proc = run_with_reader_gone([CTL, "--node-config", str(node_config), *args])
    assert proc.returncode == agentctl.EXIT_BROKEN_PIPE, (proc.returncode, proc.stderr.decode())
    assert b"Traceback" not in proc.stderr and b"BrokenPipeError" not in proc.stderr, proc.stderr.decode()


def test_agent_status_through_head_prints_its_first_line_quietly(node_config):
    """The reported case, through a shell, as an operator types it (an agent not running
    answers on stderr and exits 3; --json answers on stdout)."""
    proc = subprocess.run(["bash", "-c", f"'{CTL}' --node-config '{node_config}' agent status --json | head -1"],
                          capture_output=True, timeout=120, check=False)
    assert proc.stdout.decode().strip() == "{"
    assert b"Traceback" not in proc.stderr and b"BrokenPipe" not in proc.stderr, proc.stderr.decode()


def test_python_m_agentctl_goes_through_the_same_place(node_config):
    proc = run_with_reader_gone([sys.executable, "-m", "tenantnet.entry.agentctl", "--node-config",
                                 str(node_config), "status", "--json"])
    assert proc.returncode == agentctl.EXIT_BROKEN_PIPE and b"Traceback" not in proc.stderr, proc.stderr.decode()


def test_with_a_reader_the_exit_status_is_the_commands(node_config):
    proc = subprocess.run([CTL, "--node-config", str(node_config), "agent", "status", "--json"],
                          capture_output=True, timeout=120, check=False)
    assert proc.returncode == 3 and b'"running": false' in proc.stdout


def test_a_broken_pipe_that_is_not_stdouts_is_not_swallowed(monkeypatch, tmp_path):
    """A socket's EPIPE inside a command is a real failure: raised as before. (pytest's own
    stdout has no descriptor; a real, open one stands in.)"""
    def command() -> int:
        raise BrokenPipeError(32, "Broken pipe (a socket)")

    with open(tmp_path / "out", "w") as stdout:
        monkeypatch.setattr(sys, "stdout", stdout)
        with pytest.raises(BrokenPipeError):
            agentctl.exit_status_of(command)


def test_exit_status_of_passes_codes_and_system_exit_through():
    assert agentctl.exit_status_of(lambda: 4) == 4
    assert agentctl.exit_status_of(lambda: None) == 0
    with pytest.raises(SystemExit):
        agentctl.exit_status_of(lambda: sys.exit(2))
