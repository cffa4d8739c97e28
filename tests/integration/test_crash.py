"""A plugin process SIGKILLed in the middle of ADD, then DEL or GC: nothing is left behind."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import time

import pytest

from tests.integration.conftest import PLUGIN, new_cid

POINTS = ["add.recorded", "add.attached", "add.ipam-done"]


def all_state_files(lab):
    root = lab.state_dir / "attachments"
    return [p for p in root.rglob("*") if p.is_file()] if root.exists() else []


@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize("cleanup", ["DEL", "DEL-no-netns", "GC"])
def test_sigkill_at_named_point(lab, plugin, netns_factory, no_leftovers, point, cleanup):
    ns = netns_factory()
    cid = new_cid()
    conf = plugin.conf()
    plugin.extra_env["TENANTNET_TEST_FAULT"] = point
    inv = plugin.add(conf, ns, cid)
    plugin.extra_env.clear()
    assert inv.code == -signal.SIGKILL and inv.stdout == ""
    assert len(lab.records()) == 1  # the intent was on disk before anything else
    if cleanup == "GC":
        gc = {**conf, "cniVersion": "1.1.0", "cni.dev/valid-attachments": []}
        out = plugin.raw(plugin.env("GC", netns=None, cni_args=""), json.dumps(gc))
    else:
        out = plugin.call("DEL", conf, cid, ns.path if cleanup == "DEL" else "")
    assert out.code == 0, out.stdout
    assert all_state_files(lab) == []
    assert ns.run("ip", "link", "show", "net1").returncode != 0


def test_sigkill_at_random_instants(lab, plugin, netns_factory, no_leftovers):
    """A second net behind the named crash points: kills at random instants of a real ADD.
    A trial counts only if its kill landed before the ADD completed (the process still
    running, nothing printed). Trials go on until `wanted` have landed (at most `most`
    trials): how many land depends on this machine's timing, not on the plugin — an ADD can
    finish sooner than the ones measured, or the sleep overshoot under load — so a fixed
    number of trials made the test flaky. Every trial, landed or not, must leave nothing."""
    rng = random.Random(1234)
    conf = plugin.conf()
    # How long an un-faulted ADD takes here, so the kills are drawn from inside it: the first
    # is slower (cold caches), the fastest of the rest bounds the draw.
    durations = []
    for _ in range(3):
        ns = netns_factory()
        cid = new_cid()
        started = time.monotonic()
        assert plugin.add(conf, ns, cid).code == 0
        durations.append(time.monotonic() - started)
        assert plugin.call("DEL", conf, cid, ns.path).code == 0
    duration = min(durations[1:])
    wanted, most = 6, 20
    landed = trials = 0
    while landed < wanted and trials < most:
        trials += 1
        ns = netns_factory()
        cid = new_cid()
        env = plugin.env("ADD", cid, ns.path, "net1")
        plugin.attempts.append((conf, cid, "net1"))
        proc = subprocess.Popen([PLUGIN], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env)
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        proc.stdin.write(json.dumps(conf).encode())
        proc.stdin.close()
        time.sleep(rng.uniform(0.0, duration * 0.8))
        running = proc.poll() is None
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        printed = proc.stdout.read()
        proc.stdout.close()
        proc.stderr.close()
        if running and proc.returncode == -signal.SIGKILL and not printed:
            landed += 1
        out = plugin.call("DEL", conf, cid, "")
        assert out.code == 0, out.stdout
        assert all_state_files(lab) == []
        assert ns.run("ip", "link", "show", "net1").returncode != 0
    print(f"random-instant kills: {landed} of {trials} landed before the ADD completed")
    assert landed >= wanted, f"only {landed} of {trials} kills landed mid-ADD"
