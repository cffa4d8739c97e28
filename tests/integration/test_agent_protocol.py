"""The protocol suite again, through the agent: one implementation, two ways in.

The tests of test_lifecycle, test_bad_input and test_versions are collected here a second
time, unchanged; only the `plugin` fixture differs: its node config names an `agentSocket`
served by an agent this module starts, so every exec of the shim reaches the agent (checked
after each test by the agent's own count). The original modules run the same tests
in-process (no agent answers their node config's default socket), so each test now passes
both ways or fails in one of them.

And twice here: through the compiled trampoline (`tenantnet`, trampoline/trampoline.c) and
through the Python shim it falls back to (`tenantnet-shim`), both against the same agent.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from tests.integration import test_bad_input, test_lifecycle, test_versions
from tests.integration.conftest import Invocation, Lab, PluginRunner
from tests.integration.test_agent import AgentProcess, agent_node_config, start_agent
from tests.shimways import WAYS, executable

for _module in (test_lifecycle, test_bad_input, test_versions):
    globals().update({name: obj for name, obj in vars(_module).items()
                      if name.startswith("test_") and callable(obj)})


@pytest.fixture(scope="module")
def served_by_agent(lab: Lab) -> Iterator[AgentProcess]:
    # One agent for the module, as on a node: a long-running process serving test after test.
    run_dir = Path(tempfile.mkdtemp(prefix="tna-"))
    agent = start_agent(agent_node_config(lab, run_dir))
    try:
        yield agent
    finally:
        agent.stop()
        shutil.rmtree(run_dir, ignore_errors=True)


@dataclass
class AgentRunner(PluginRunner):
    """The conftest runner, counting the calls that must have reached the agent."""

    agent_config: str = ""
    via_agent: int = 0

    def raw(self, env: dict[str, str], stdin: bytes | str, timeout: float = 60) -> Invocation:
        # A test may point TENANTNET_CONFIG elsewhere (e.g. an unwritable state dir): that
        # node config names no agent, so the call rightly runs in-process.
        if env.get("TENANTNET_CONFIG") == self.agent_config:
            self.via_agent += 1
        return super().raw(env, stdin, timeout)


@pytest.fixture(params=WAYS)
def plugin(request: pytest.FixtureRequest, lab: Lab, served_by_agent: AgentProcess) -> Iterator[PluginRunner]:
    runner = AgentRunner(replace(lab, node_config=served_by_agent.node_config),
                         agent_config=str(served_by_agent.node_config), executable=executable(request.param))
    before = served_by_agent.served()
    yield runner
    for conf, cid, ifname in list(reversed(runner.cleanups)):
        runner.call("DEL", conf, cid, "", ifname)
    assert served_by_agent.proc.poll() is None, "the agent died"
    assert served_by_agent.served() - before == runner.via_agent, "a call did not reach the agent"
