"""Shared bench plumbing: exec a plugin as a runtime would, summarise, write a markdown block."""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BIN = Path(sys.executable).parent  # this venv's bin: the plugins' shims
PLUGIN = str(BIN / "tenantnet")


def runtime_env(node_config: str | None = None) -> dict[str, str]:
    """What a runtime passes to every call of this venv's plugins (the verb-specific rest is added
    per call): PATH, CNI_PATH with the venv's bin and Debian's Go plugins, pod identity args."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
           "CNI_PATH": f"{BIN}:/usr/lib/cni",
           "CNI_IFNAME": "net1", "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAMESPACE=bench;K8S_POD_NAME=p"}
    if node_config:
        env["TENANTNET_CONFIG"] = node_config
    return env


def exec_plugin(cmd: str, env: dict[str, str], conf: dict) -> float:
    """Wall time (ms) of one exec; a failure stops the benchmark (figures would be meaningless)."""
    start = time.perf_counter()
    proc = subprocess.run([cmd], input=json.dumps(conf).encode(), env=env, capture_output=True, check=False)
    elapsed = (time.perf_counter() - start) * 1000
    if proc.returncode != 0:
        raise SystemExit(f"{cmd} {env['CNI_COMMAND']} failed: {proc.stdout.decode()} {proc.stderr.decode()}")
    return elapsed


def interleaved(plugins: list[tuple[str, str, dict]] | list[tuple[str, str, dict, str]],
                base_env: dict[str, str], count: int) -> dict[str, list[float]]:
    """ADD then DEL of one attachment per plugin per round, each in a fresh netns (made and
    removed outside the timing), rounds interleaved so that machine noise hits all alike.
    A plugin entry is (who, executable, network config[, node config for TENANTNET_CONFIG]).
    Returns "<who>-add" / "<who>-del" → wall times in ms."""
    import uuid

    times: dict[str, list[float]] = {f"{p[0]}-{v}": [] for p in plugins for v in ("add", "del")}
    netns: list[str] = []
    try:
        for i in range(count):
            for who, cmd, conf, *node in plugins:
                name = f"tnb-{uuid.uuid4().hex[:8]}"
                subprocess.run(["ip", "netns", "add", name], check=True)
                netns.append(name)
                env = {**base_env, "CNI_CONTAINERID": uuid.uuid4().hex, "CNI_NETNS": f"/run/netns/{name}",
                       **({"TENANTNET_CONFIG": node[0]} if node else {})}
                times[f"{who}-add"].append(exec_plugin(cmd, {**env, "CNI_COMMAND": "ADD"}, conf))
                times[f"{who}-del"].append(exec_plugin(cmd, {**env, "CNI_COMMAND": "DEL"}, conf))
                subprocess.run(["ip", "netns", "delete", name], check=True)
                netns.remove(name)
            print(f"\r{i + 1}/{count}", end="", file=sys.stderr, flush=True)
        print(file=sys.stderr)
    finally:
        for name in netns:
            subprocess.run(["ip", "netns", "delete", name], check=False)
    return times


def burst_jobs(netns_paths: list[str], rails: int) -> list[tuple[str, str, int]]:
    """The attachments of a burst: per pod (netns path) one container id and interfaces
    net1..net<rails>; (container id, netns path, rail) each."""
    import uuid

    return [(cid, path, r) for path in netns_paths for cid in [uuid.uuid4().hex] for r in range(1, rails + 1)]


def run_burst(plugin: str, base_env: dict[str, str], confs: dict[int, bytes],
              jobs: list[tuple[str, str, int]], parallel: int,
              counters: dict[str, Callable[[], float]] | None = None,
              verbs: tuple[str, ...] = ("ADD", "DEL")) -> dict[str, dict[str, Any]]:
    """Exec `plugin` for every job, `parallel` at once, one verb after the other (a rail's
    network config is `confs[rail]`), as a runtime would: per verb {"results": [(exit code,
    stdout)] in job order, "wall": seconds, "<counter>": how much each of `counters` (e.g. a
    process's CPU seconds) grew during it}."""
    from concurrent.futures import ThreadPoolExecutor

    counters = counters or {}

    def one(command: str, job: tuple[str, str, int]) -> tuple[int, bytes]:
        cid, path, rail = job
        env = {**base_env, "CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_IFNAME": f"net{rail}",
               "CNI_NETNS": path if command == "ADD" else "",
               "CNI_ARGS": f"IgnoreUnknown=1;K8S_POD_NAMESPACE=burst;K8S_POD_NAME={cid[:8]}"}
        proc = subprocess.run([plugin], input=confs[rail], env=env, capture_output=True, check=False)
        return proc.returncode, proc.stdout

    phases: dict[str, dict[str, Any]] = {}
    with ThreadPoolExecutor(parallel) as pool:
        for verb in verbs:
            before = {name: read() for name, read in counters.items()}
            start = time.perf_counter()
            results = list(pool.map(lambda j, v=verb: one(v, j), jobs))
            wall = time.perf_counter() - start
            phases[verb] = {"results": results, "wall": wall,
                            **{name: read() - before[name] for name, read in counters.items()}}
    return phases


def cpu_seconds(pid: int | None, *, children: bool = False) -> float:
    """User + system CPU seconds a process has used so far (0 if it cannot be read); with
    `children`, also those of its children it has waited for."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        ticks = int(fields[11]) + int(fields[12]) + (int(fields[13]) + int(fields[14]) if children else 0)
        return ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"median": statistics.median(ordered), "p90": ordered[int(0.9 * (len(ordered) - 1))]}


def machine_line(count: int, what: str) -> str:
    return (f"Measured {time.strftime('%Y-%m-%d')} on {os.cpu_count()} cores, Linux {platform.release()}, "
            f"Python {platform.python_version()}; {count} {what}, interleaved; each figure is the wall "
            "time of one exec of the plugin (ms).")


def table(rows: list[tuple[str, dict[str, float], dict[str, float]]], ours: str, ref: str) -> list[str]:
    lines = [f"| verb | {ours} median | p90 | {ref} median | p90 | ratio (median) |",
             "|---|---:|---:|---:|---:|---:|"]
    for verb, mine, theirs in rows:
        lines.append(f"| {verb} | {mine['median']:.1f} | {mine['p90']:.1f} | {theirs['median']:.1f} | "
                     f"{theirs['p90']:.1f} | {mine['median'] / theirs['median']:.2f}× |")
    return lines


def write_block(out: str | None, name: str, lines: list[str]) -> None:
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    block = "\n".join([begin, *lines, end])
    print(block)
    if not out:
        return
    path = Path(out)
    text = path.read_text() if path.exists() else "# Benchmarks\n\n"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    path.write_text(text)


if __name__ == "__main__":
    # `bench_x.py | python -m bench.common NAME OUT`: put a script's markdown between markers.

    write_block(sys.argv[2], sys.argv[1], sys.stdin.read().rstrip("\n").splitlines())


def start_agent(node_config: Path, log: Path, workers: int | None = None) -> subprocess.Popen[bytes]:
    """`tenantnetctl agent run` for `node_config` (which names its agentSocket), once it answers;
    `workers`: its --workers (None: the agent's default)."""

    from tenantnet.entry import agentctl as agentmod
    from tenantnet.entry import shim
    from tenantnet.plugin import nodepath

    with open(log, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "tenantnet.entry.agentctl", "--node-config",
                                 str(node_config), "run", *(["--workers", str(workers)] if workers else [])],
                                stdout=subprocess.DEVNULL, stderr=err)
    sock = nodepath.agent_socket_of(str(node_config))[0]
    deadline = time.monotonic() + 30
    while True:
        try:
            agentmod.query_status(sock)
            return proc
        except (shim.AgentUnavailable, shim.AgentFailed):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"agent did not start: {log.read_text()}") from None
            time.sleep(0.05)


def stop_agent(proc: subprocess.Popen[bytes]) -> None:
    import signal

    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def stop_procs(procs: list[subprocess.Popen[Any]], timeout: float) -> None:
    """SIGTERM to each of ours (by pid) still running, then each given `timeout` s to end
    before it is killed: they all stop in parallel."""
    import signal

    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def allow_data_dir(node_text: str, work: Path) -> str:
    """A lab node config that also lets the bench's IPAM dataDirs live under `work`."""
    lines = [f"{line[:-1]}, {work}]" if line.startswith("ipamDataDirs: [") else line
             for line in node_text.splitlines()]
    return "\n".join(lines) + "\n"


def node_configs(node_config: str, work: Path) -> tuple[Path, Path]:
    """Two copies of a lab's node config under `work`: one naming the agent socket
    `work/sock/agent.sock` (for start_agent), one naming a socket nobody serves (in-process)."""
    text = allow_data_dir(Path(node_config).read_text(), work)
    agent_conf, plain_conf = work / "agent.yaml", work / "plain.yaml"
    agent_conf.write_text(text + f"agentSocket: {work}/sock/agent.sock\n")
    plain_conf.write_text(text + f"agentSocket: {work}/none/agent.sock\n")
    return agent_conf, plain_conf
